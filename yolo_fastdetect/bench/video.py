"""``yolo-fastdetect bench video``: H.264 video through ``model.predict``, stock Ultralytics against ours with CPU
decoding and with NVDEC, beside the decode-only ceilings measured in the same run.

It writes its own clips in a temporary folder (``--keep DIR`` keeps them): camera-like H.264 clips (libx264,
yuv420p, BT.709, an IDR picture every 2 s as cameras write them) panning and zooming across the wheel's images
(``bench/_camera_clips.py``). One process, one model
(``--model``, seeded with raised class biases as the other benchmarks make it; fp16 on CUDA), toggled with
``yolo_fastdetect.disable()`` / ``enable()``; ours reads with cv2 (``YOLO_FASTDETECT_PYAV_VIDEO=0``), with PyAV's
planes converted on the GPU (``=1``, the default) and with NVDEC (``YOLO_FASTDETECT_GPU_VIDEO=1``), each where it
applies (otherwise the row says why). Every timed side runs
once untimed first, then the median of ``--repeats`` passes is reported. Scenarios (``--scenarios``):

- ``one_stream``: one ``--one-stream-size`` clip of ``--frames`` frames, ``model.predict(path, batch=--batch,
  stream=True)``, frames per second; ceilings: ``cv2.VideoCapture`` grab + retrieve of the clip (stock's reader; ours
  reads a video on one such thread), PyAV's planes alone (``sources/av_planes.py``'s ``PlanesVideo``, converted on the
  GPU with their host copies) and NVDEC alone (``sources/nvdec.py``'s ``NvdecVideo`` with the decoders the loader
  gives one video: BGR on the GPU and its pinned host copy, as the loader hands frames to the predictor).
- ``many_streams``: ``--streams`` copies of one ``--many-streams-size`` clip of ``--many-frames`` frames, predicted
  as one list of videos at ``--batch`` (stock has no list-of-videos path: its side predicts each video alone, one
  after the other), total frames per second; ceilings: the clips decoded at once by cv2 on one thread each, by cv2 in
  one process each (started together after their imports: the many-core ceiling of the CPU path), by PyAV's planes
  and by NVDEC on one thread each. Ours / ceiling: cv2 against its processes, PyAV and NVDEC against their threads.
- ``folder``: the same clips as a folder, ``model.predict(folder, batch=--batch, stream=True)``: stock reads a
  folder's videos one after another on the predictor's thread, ours decodes several at once and hands them out in
  stock's order; ceilings as ``many_streams``.
- ``live_latency``: batch 1, a ``--live-fps`` source (a camera): the first ``--live-frames`` frames of the
  one-stream clip, decoded beforehand, released at t0 + i / fps each and predicted one ``model.predict(frame)`` call
  at a time as they come; per-frame latency from release to the boxes on the host, median and p95 (ms).

Each side's detections are compared with stock's (per video, in frame order: same box counts). ``--phases`` adds a
pass of each of ours split where the predictor's thread spends it (``bench/_predict_phases.py``: waiting for the
next batch, Ultralytics' stages, the rest) and where its video readers' threads spend theirs (in the decoder, waiting
for room in their queues), to tell whether the source or the predictor bounds it, how much of those threads' time
is off the CPU (``off_cpu_us``: blocked on the GIL or a queue), and on a GPU the pinned memory PyTorch's host
allocator made during that pass (``pinned_made_mb``). Each row also gives what the rest of the host
did meanwhile (:mod:`._host`: ``host_other_cores``, ``host_steal_percent``). ``--device cpu`` with tiny clips is a
smoke run. ``--json PATH`` appends each row as a record as its scenario ends (``benchmarks/records/video.json``).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from ..sources.video import nvdec_decoders
from . import _cv2_decode
from ._camera_clips import camera_size, write_camera_clip
from ._host import host_activity, host_cpu_times
from ._predict_phases import OFF_CPU, PREDICT_PHASES, READER_PHASES, predict_phases
from ._timing import append_records, detecting_model, environment_line, record_header
from .sources import decoded, nvdec_frames, planes_frames, predict_pass, same_detections

SCENARIOS = ("one_stream", "many_streams", "folder", "live_latency")


def median_rate(rate: Callable[[], float], repeats: int) -> float:
    """The median of ``repeats`` calls of ``rate()`` after an untimed one."""
    rate()
    return statistics.median(rate() for _ in range(repeats))


def concurrent_rate(frames_of: Callable[[str], int], paths: list[str]) -> float:
    """Frames per second of ``frames_of`` run on every path at once, one thread each (all frames over the wall
    time)."""
    with ThreadPoolExecutor(len(paths)) as pool:
        begin = time.perf_counter()
        total = sum(pool.map(frames_of, paths))
        return total / (time.perf_counter() - begin)


def processes_rate(paths: list[str]) -> float:
    """Frames per second of cv2 decoding every path at once, one process each, timed from the moment all of them
    have imported cv2 (``_cv2_decode.py`` run as a script)."""
    children = [subprocess.Popen([sys.executable, _cv2_decode.__file__, path], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True) for path in paths]
    try:
        for child in children:
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("a cv2 decoding process did not start")
        begin = time.perf_counter()
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        total = sum(int(child.stdout.readline()) for child in children)
        return total / (time.perf_counter() - begin)
    finally:
        for child in children:
            child.communicate()


def predict_rate(model, source, batch: int, options: dict, records: list) -> float:
    """Frames per second of one ``stream=True`` pass of ``model.predict(source)``; its records go to ``records``
    (replacing the last pass's)."""
    seconds, records[:] = predict_pass(model, source, batch, options)
    return len(records) / seconds


def one_by_one_rate(model, paths: list[str], batch: int, options: dict, records: list) -> float:
    """Frames per second of predicting each video alone, one after the other (stock's way with several videos)."""
    passes = [predict_pass(model, path, batch, options) for path in paths]
    records[:] = [record for _, made in passes for record in made]
    return len(records) / sum(seconds for seconds, _ in passes)


def by_video(records: list) -> list:
    """``(path, boxes)`` records grouped per video, each video's frames in their order: interleaved videos and videos
    read one after the other then compare frame by frame."""
    return sorted(records, key=lambda record: record[0])  # sorted() is stable: frame order kept within a video


def nvdec_reason(path: str, device: str) -> str | None:
    """Why NVDEC does not run on ``path`` here, or None."""
    if device != "cuda":
        return "no CUDA device"
    from yolo_fastdetect.sources.nvdec import nvdec_unavailable_reason

    return nvdec_unavailable_reason(path)


def planes_reason(path: str, device: str) -> str | None:
    """Why PyAV's planes do not run on ``path`` here, or None."""
    if device != "cuda":
        return "no CUDA device"
    from yolo_fastdetect.sources.av_planes import planes_tags_or_reason

    outcome = planes_tags_or_reason(path)
    return outcome if isinstance(outcome, str) else None


def converted_reasons(path: str, device: str) -> dict[str, str | None]:
    """Per side whose frames the GPU converts (``pyav``, ``nvdec``), why it does not run on ``path`` here, or None."""
    return {"pyav": planes_reason(path, device), "nvdec": nvdec_reason(path, device)}


def add_converted_ceilings(figures: dict, reasons: dict[str, str | None], paths: list[str], repeats: int) -> None:
    """Add the decode-only ceilings of PyAV's planes and of NVDEC on ``paths`` at once (one thread each) to
    ``figures``, each where ``reasons`` lets it run; NVDEC with the decoders the loader gives that many videos."""
    if reasons["pyav"] is None:
        figures["pyav_decode_fps"] = median_rate(lambda: concurrent_rate(planes_frames, paths), repeats)
    if reasons["nvdec"] is None:
        decode = functools.partial(nvdec_frames, decoders=nvdec_decoders(len(paths)))
        figures["nvdec_decode_fps"] = median_rate(lambda: concurrent_rate(decode, paths), repeats)


def skipped(reasons: dict[str, str | None]) -> str | None:
    """The row's note: the sides not run, and why."""
    names = {"pyav": "PyAV planes", "nvdec": "NVDEC"}
    return "; ".join(f"{names[side]} not run: {reason}" for side, reason in reasons.items() if reason) or None


def pinned_blocks_made() -> int | None:
    """Bytes of the pinned blocks PyTorch's caching host allocator has made so far in the process (each a
    ``cudaHostAlloc``), or None without CUDA. Over a pass after an untimed one, near zero where the allocator reuses
    its blocks: much more says it waits on events to free them (docs/video_design.md, Pinned memory)."""
    return torch.cuda.host_memory_stats().get("allocated_bytes.allocated", 0) if torch.cuda.is_available() else None


def predicted_sides(model, source, paths: list[str], batch: int, options: dict, repeats: int,
                    reasons: dict[str, str | None], phases: bool = False) -> dict:
    """Stock (each video alone where ``source`` is a list), ours reading with cv2 and, where ``reasons`` has None
    for them, ours with PyAV's planes and with NVDEC: each side's median frames per second and whether its
    detections are stock's; with ``phases``, one more pass of each of ours, split at
    :data:`._predict_phases.PREDICT_PHASES`, :data:`._predict_phases.READER_PHASES` and
    :data:`._predict_phases.OFF_CPU` (µs a frame), with the pinned memory it made (:func:`pinned_blocks_made`, MB) on
    a GPU."""
    import yolo_fastdetect
    from yolo_fastdetect.sources import GPU_VIDEO_VARIABLE, PYAV_VIDEO_VARIABLE

    yolo_fastdetect.disable()
    stock_records: list = []
    if isinstance(source, list):
        stock = median_rate(lambda: one_by_one_rate(model, paths, batch, options, stock_records), repeats)
    else:
        stock = median_rate(lambda: predict_rate(model, source, batch, options, stock_records), repeats)
    yolo_fastdetect.enable()
    figures = {"stock_fps": stock}
    settings = {"cpu": {GPU_VIDEO_VARIABLE: "0", PYAV_VIDEO_VARIABLE: "0"},
                "pyav": {GPU_VIDEO_VARIABLE: "0", PYAV_VIDEO_VARIABLE: "1"},
                "nvdec": {GPU_VIDEO_VARIABLE: "1", PYAV_VIDEO_VARIABLE: "0"}}
    for side, environment in settings.items():
        if reasons.get(side) is not None:
            continue
        records: list = []
        ours_pass = functools.partial(predict_rate, model, source, batch, options, records)
        with mock.patch.dict(os.environ, environment):  # restored after, whatever it was
            figures[f"ours_{side}_fps"] = median_rate(ours_pass, repeats)
            if phases:
                made = pinned_blocks_made()
                split, readers, off_cpu = predict_phases(model, source, batch, options)
                figures[f"ours_{side}_phases_us"] = [-1.0 if value is None else value for value in split.values()]
                figures[f"ours_{side}_readers_us"] = list(readers.values())
                figures[f"ours_{side}_off_cpu_us"] = list(off_cpu.values())
                if made is not None:
                    figures[f"ours_{side}_pinned_made_mb"] = (pinned_blocks_made() - made) / 1e6
        difference = same_detections(by_video(records), by_video(stock_records))
        figures[f"same_detections_{side}"] = difference["same_paths"] and difference["same_counts"]
    return figures


def one_stream(model, path: str, args, options: dict) -> dict:
    """The ``one_stream`` scenario's figures."""
    reasons = converted_reasons(path, args.device)
    figures = predicted_sides(model, path, [path], args.batch, options, args.repeats, reasons, args.phases)
    figures["cv2_decode_fps"] = median_rate(lambda: concurrent_rate(_cv2_decode.cv2_frames, [path]), args.repeats)
    add_converted_ceilings(figures, reasons, [path], args.repeats)
    return {"figures": figures, "note": skipped(reasons)}


def many_streams(model, source: list[str] | str, paths: list[str], args, options: dict) -> dict:
    """The ``many_streams`` (``source`` the list of ``paths``) and ``folder`` (``source`` their folder) scenarios'
    figures."""
    reasons = converted_reasons(paths[0], args.device)
    figures = predicted_sides(model, source, paths, args.batch, options, args.repeats, reasons, args.phases)
    figures["cv2_threads_decode_fps"] = median_rate(lambda: concurrent_rate(_cv2_decode.cv2_frames, paths),
                                                    args.repeats)
    figures["cv2_processes_decode_fps"] = median_rate(lambda: processes_rate(paths), args.repeats)
    add_converted_ceilings(figures, reasons, paths, args.repeats)
    return {"figures": figures, "note": skipped(reasons)}


def paced(frames: list[np.ndarray], fps: float) -> Iterator[tuple[float, np.ndarray]]:
    """``(release time, frame)``: frame i released at t0 + i / ``fps`` (``time.perf_counter``), as a camera gives
    them; a frame whose time has passed comes at once."""
    start = time.perf_counter()
    for index, frame in enumerate(frames):
        release = start + index / fps
        time.sleep(max(0.0, release - time.perf_counter()))
        yield release, frame


def latencies_ms(model, frames: list[np.ndarray], fps: float, options: dict) -> list[float]:
    """Per frame of a paced pass, milliseconds from its release to its boxes on the host, one ``model.predict`` call
    per frame (batch 1)."""
    latencies = []
    for release, frame in paced(frames, fps):
        result = model.predict(frame, **options)[0]
        result.boxes.data.cpu()
        latencies.append((time.perf_counter() - release) * 1e3)
    return latencies


def live_latency(model, path: str, args, options: dict) -> dict:
    """The ``live_latency`` scenario's figures: per side, the medians over the passes of the median and the p95
    latency (ms)."""
    import yolo_fastdetect

    frames = decoded("video", [path])[: args.live_frames]
    figures = {}
    for side, switch in (("stock", yolo_fastdetect.disable), ("ours", yolo_fastdetect.enable)):
        switch()
        latencies_ms(model, frames, args.live_fps, options)
        passes = [latencies_ms(model, frames, args.live_fps, options) for _ in range(args.repeats)]
        figures[f"{side}_latency_ms"] = [
            statistics.median(float(np.percentile(latencies, q)) for latencies in passes) for q in (50, 95)]
    figures["source_fps"] = args.live_fps
    return {"figures": figures, "note": None}


def write_clips(root: Path, args) -> dict[str, list[str]]:
    """The clips each scenario reads: the one-stream clip (live latency reads its first frames too) and the
    many-streams copies (of one clip: each stream decodes the same work)."""
    clips = {}
    if {"one_stream", "live_latency"} & set(args.scenarios):
        frames = max(args.frames, args.live_frames)
        clips["one"] = [str(write_camera_clip(root / "one_stream.mp4", frames, args.one_stream_size))]
    if {"many_streams", "folder"} & set(args.scenarios):
        folder = root / "streams"  # the folder scenario's source: these clips alone
        folder.mkdir(exist_ok=True)
        first = write_camera_clip(folder / "stream_0.mp4", args.many_frames, args.many_streams_size)
        clips["many"] = [str(first)] + [str(shutil.copyfile(first, folder / f"stream_{index}.mp4"))
                                        for index in range(1, args.streams)]
    return clips


def run(args) -> list[dict]:
    """Every asked scenario, as rows: ``scenario``, its ``config``, ``figures`` and ``note``."""
    cuda = args.device == "cuda"
    options = {"device": args.device, "verbose": False, "imgsz": args.imgsz, "quantize": 16 if cuda else None}
    model = detecting_model(args.model)
    rows = []
    with tempfile.TemporaryDirectory(prefix="yfd_bench_video_") as scratch:
        root = Path(args.keep or scratch)
        root.mkdir(parents=True, exist_ok=True)
        clips = write_clips(root, args)
        for scenario in args.scenarios:
            before = host_cpu_times()
            if scenario == "one_stream":
                row = one_stream(model, clips["one"][0], args, options)
                config = {"streams": 1, "size": args.one_stream_size, "frames": args.frames, "batch": args.batch}
            elif scenario in ("many_streams", "folder"):
                paths = clips["many"]
                source = paths if scenario == "many_streams" else str(Path(paths[0]).parent)
                row = many_streams(model, source, paths, args, options)
                config = {"streams": args.streams, "size": args.many_streams_size, "frames": args.many_frames,
                          "batch": args.batch}
            else:
                row = live_latency(model, clips["one"][0], args, options)
                config = {"streams": 1, "size": args.one_stream_size, "frames": args.live_frames, "batch": 1}
            activity = host_activity(before, host_cpu_times())
            if activity is not None:
                row["figures"].update(activity.figures())
            rows.append({"scenario": scenario, "config": config, **row})
            print(f"  {scenario}: {summary(rows[-1])}", flush=True)
            if args.json:  # each scenario's as it ends: a run stopped by a time limit keeps the scenarios done
                append_records(args.json, records(rows[-1:], args.device))
    return rows


def summary(row: dict) -> str:
    """A row in one line, as the progress output prints it."""
    figures = row["figures"]
    text = ", ".join(f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}"
                     for key, value in figures.items() if not isinstance(value, list))
    lists = ", ".join(f"{key} {' / '.join(f'{v:.1f}' for v in value)}" for key, value in figures.items()
                      if isinstance(value, list))
    return "; ".join(filter(None, [text, lists, row["note"]]))


def records(rows: list[dict], device: str) -> list[dict]:
    """The rows as records of ``benchmarks/records/video.json``: figures rounded, the table ``gpu`` or ``cpu``."""
    header = record_header("video", "cpu" if device == "cpu" else "gpu")
    made = []
    for row in rows:
        figures = {key: [round(v, 2) for v in value] if isinstance(value, list) else
                   round(value, 1) if isinstance(value, float) else value for key, value in row["figures"].items()}
        record = {**header, "config": {"scenario": row["scenario"], **row["config"]}, "figures": figures}
        if row["note"]:
            record["note"] = row["note"]
        made.append(record)
    return made


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; ``argv`` are the options after ``bench video``."""
    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench video", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="yolov8s.yaml")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--batch", type=int, default=8, help="batch of one_stream and many_streams (default 8)")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--one-stream-size", default="720p", help="720p, 1080p, ... or WIDTHxHEIGHT (default 720p)")
    parser.add_argument("--frames", type=int, default=300, help="frames of the one-stream clip (default 300)")
    parser.add_argument("--many-streams-size", default="1080p", help="as --one-stream-size (default 1080p)")
    parser.add_argument("--many-frames", type=int, default=150, help="frames of each stream (default 150)")
    parser.add_argument("--streams", type=int, default=8, help="streams of many_streams (default 8)")
    parser.add_argument("--live-frames", type=int, default=90, help="frames of each live pass (default 90)")
    parser.add_argument("--live-fps", type=float, default=30.0, help="the live source's frame rate (default 30)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per side (default 3)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--phases", action="store_true",
                        help="one more pass of each of ours, split at: " + ", ".join(PREDICT_PHASES)
                        + " (µs a frame; batch waits -1 where not told); its video readers' thread time: "
                        + ", ".join(READER_PHASES) + "; those threads' time off the CPU: " + ", ".join(OFF_CPU)
                        + "; and on a GPU the pinned memory made in it (MB)")
    parser.add_argument("--keep", type=Path, help="write the clips here and keep them")
    parser.add_argument("--json", type=Path, help="append the rows as records to this file (benchmarks/records/)")
    args = parser.parse_args(argv)
    for size in (args.one_stream_size, args.many_streams_size):
        camera_size(size)  # a bad size fails here, before any work
    print(f"bench video: {environment_line()} | {os.cpu_count()} CPUs | model {args.model}", flush=True)
    run(args)


if __name__ == "__main__":
    main()
