"""``python -m yolo_fastdetect bench sources``: ``model.predict`` on files, stock Ultralytics against ours.

It writes its own data in a temporary folder (``--keep DIR`` keeps it there): ``--images`` JPEGs cycling through
640x480, 1280x720, 1920x1080 and 3840x2160 at qualities 75/90/95 (random crops of the wheel's images), and a 720p
and a 1080p mp4 clip of ``--frames`` frames (mp4v; also H.264 where ``--gpu-video`` runs). Then, in one process on
one model (toggled with ``yolo_fastdetect.disable()`` / ``enable()``), with ``stream=True``, fp16 on CUDA:

- a Python list of the paths, and the folder, at each ``--batches``; each clip at each ``--video-batches``;
- per case: stock and ours (an untimed pass first, then the median of ``--repeats`` passes), in images (frames)
  per second; the ceiling of a pipelined loader, min(decode-only rate on all decoder threads, ours on the same
  images already in memory at that batch size), and ours as a share of it; whether both detect the same (same
  paths in order, same box counts, largest distance from one of our boxes to stock's nearest of its class);
- ``--sources`` picks the cases (``list``, ``folder``, ``video``); ``--gpu-jpeg`` also times ours on the folder with
  ``YOLO_FASTDETECT_GPU_JPEG=1`` (nvJPEG, opt-in: not stock's pixels, so its detections are compared too);
  ``--nice-off`` also times ours on the list and the folder with ``YOLO_FASTDETECT_DECODER_NICE=0`` (the decoder
  threads at the predictor's priority): the same-run A/B of the default nice +5; ``--gpu-video`` (the default where
  PyNvVideoCodec loads, on CUDA) also times ours on H.264 clips with ``YOLO_FASTDETECT_GPU_VIDEO=1`` (NVDEC; stock's
  frames, so the detections are compared too) and NVDEC's decode-only rate, the copy to pinned host memory included;
- peak host memory of loading a list of ``--memory-paths`` paths (640x480 files, repeated): stock's loader (which
  decodes the whole list first) against ours, each in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import cv2
import torch

from ._source_data import SIZES, write_clip, write_jpegs
from ._timing import detecting_model, environment_line
from .e2e import detection_difference


def predict_pass(model, source, batch: int, options: dict) -> tuple[float, list]:
    """Seconds of one full ``stream=True`` pass, and per result its path and ``Boxes`` (on the CPU)."""
    records = []
    begin = time.perf_counter()
    for result in model.predict(source, stream=True, batch=batch, **options):
        records.append((result.path, result.boxes.cpu()))
    if options["device"] == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - begin, records


def timed_rate(model, source, batch: int, options: dict, repeats: int) -> tuple[float, list]:
    """Median images per second over ``repeats`` passes after an untimed one; the last pass's records."""
    predict_pass(model, source, batch, options)
    rates = []
    for _ in range(repeats):
        seconds, records = predict_pass(model, source, batch, options)
        rates.append(len(records) / seconds)
    return statistics.median(rates), records


def same_detections(ours: list, stock: list) -> dict:
    """Whether both passes saw the same paths in order, and :func:`detection_difference` of their boxes."""
    difference = detection_difference(*([SimpleNamespace(boxes=boxes) for _, boxes in side] for side in (ours, stock)))
    difference["same_paths"] = [path for path, _ in ours] == [path for path, _ in stock]
    return difference


def decode_rate(source) -> float:
    """Images (frames) per second of our loader alone on ``source`` (decoder threads as configured, batch 64)."""
    from yolo_fastdetect.sources import file_loader

    begin = time.perf_counter()
    count = sum(len(images) for _, images, _ in file_loader(source, batch=64))
    return count / (time.perf_counter() - begin)


def in_memory_rate(model, images: list, batch: int, options: dict, repeats: int) -> float:
    """Ours on already-decoded images, ``batch`` at a time: the GPU side's rate, the loader's other ceiling."""
    def one_pass():
        begin = time.perf_counter()
        for start in range(0, len(images), batch):
            model.predict(images[start : start + batch], batch=batch, **options)
        if options["device"] == "cuda":
            torch.cuda.synchronize()
        return len(images) / (time.perf_counter() - begin)

    one_pass()
    return statistics.median(one_pass() for _ in range(repeats))


def nvdec_frames(path: Path, decoders: int = 1) -> int:
    """The frames NVDEC alone decodes from ``path`` with ``decoders`` decoders (BGR on the GPU and its pinned host
    copy, as the loader hands them to the predictor)."""
    from yolo_fastdetect.sources.nvdec import NvdecVideo

    with NvdecVideo(str(path), torch.device("cuda", torch.cuda.current_device()), decoders=decoders) as video:
        return sum(1 for _ in video)


def planes_frames(path: Path) -> int:
    """The frames PyAV's planes alone give of ``path``, converted on the GPU with their pinned host copies, as the
    loader hands them to the predictor by default."""
    from yolo_fastdetect.sources.av_planes import PlanesVideo

    with PlanesVideo(str(path), torch.device("cuda", torch.cuda.current_device())) as video:
        return sum(1 for _ in video)


def nvdec_decode_rate(path: Path) -> float:
    """Frames per second of :func:`nvdec_frames`."""
    begin = time.perf_counter()
    return nvdec_frames(path) / (time.perf_counter() - begin)


def decoded(kind: str, paths: list[Path]) -> list:
    if kind != "video":
        return [cv2.imread(str(p)) for p in paths]
    capture, frames = cv2.VideoCapture(str(paths[0])), []
    while (frame := capture.read())[0]:
        frames.append(frame[1])
    capture.release()
    return frames


def peak_memory_mb(side: str, list_file: Path) -> float:
    """Peak resident memory (MB) of a fresh process that loads the list of paths in ``list_file`` as ``side`` does."""
    command = [sys.executable, "-m", "yolo_fastdetect.bench.sources", "--measure-memory", side, str(list_file)]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return float(output.strip().splitlines()[-1])


def _peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ``ru_maxrss``, not inherited from the parent's fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _measure_memory(side: str, list_file: str) -> None:
    """The child of :func:`peak_memory_mb`: load every image of the list, print the peak RSS in MB."""
    from ultralytics.data.build import load_inference_source

    from yolo_fastdetect.sources import PathListLoader, decode_threads

    paths = Path(list_file).read_text().splitlines()
    if side == "stock":
        load_inference_source(paths)  # autocast_list + LoadPilAndNumpy: every image decoded and held
    elif side == "ours":
        for _ in PathListLoader(paths, batch=64, threads=decode_threads()):
            pass
    print(_peak_rss_mb())  # side "imports": the imports alone, the floor of both


def make_data(root: Path, args) -> dict[str, list[Path]]:
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes]
    data = {"images": write_jpegs(root / "images", args.images, sizes=sizes)}
    for width, height in ((1280, 720), (1920, 1080)):
        data[f"video {height}p"] = [write_clip(root / f"clip_{height}p.mp4", args.frames, width, height)]
        if args.gpu_video:
            data[f"video {height}p h264"] = [write_clip(root / f"clip_{height}p_h264.mp4", args.frames, width,
                                                        height, codec="h264")]
    small = [p for p in data["images"] if p.name.endswith("_640x480.jpg")] or data["images"]
    data["memory list"] = root / "memory_list.txt"
    data["memory list"].write_text("\n".join(str(small[i % len(small)]) for i in range(args.memory_paths)))
    return data


def variants() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """The extra sides of ours: their key (in a row, and the flag's name), the variable and the value that set them,
    the cases."""
    from yolo_fastdetect.sources import DECODER_NICE_VARIABLE, GPU_JPEG_VARIABLE, GPU_VIDEO_VARIABLE

    return [("gpu_jpeg", GPU_JPEG_VARIABLE, "1", ("folder",)),
            ("nice_off", DECODER_NICE_VARIABLE, "0", ("list", "folder")),
            ("gpu_video", GPU_VIDEO_VARIABLE, "1", ("video 720p h264", "video 1080p h264"))]


def run(args) -> list[dict]:
    import yolo_fastdetect
    from yolo_fastdetect.sources import decode_threads
    from yolo_fastdetect.sources.nvdec import package_problem

    threads = decode_threads()
    cuda = args.device == "cuda"
    if args.gpu_video is None:
        args.gpu_video = cuda and package_problem() is None
    options = {"device": args.device, "verbose": False, "quantize": 16 if cuda else None}
    model = detecting_model(args.model)
    asked = [variant for variant in variants() if getattr(args, variant[0])]
    rows = []
    with tempfile.TemporaryDirectory(prefix="yfd_bench_sources_") as scratch:
        root = Path(args.keep or scratch)
        data = make_data(root, args)
        cases = [(kind, batch) for kind in ("list", "folder") if kind in args.sources for batch in args.batches]
        if "video" in args.sources:
            videos = [kind for kind in data if kind.startswith("video")]
            cases += [(kind, batch) for kind in videos for batch in args.video_batches]
        for kind, batch in cases:
            paths = data[kind] if kind.startswith("video") else data["images"]
            source = {"list": [str(p) for p in paths], "folder": str(root / "images")}.get(kind, str(paths[0]))
            row = {"source": kind, "batch": batch}
            for side, switch in (("stock", yolo_fastdetect.disable), ("ours", yolo_fastdetect.enable)):
                switch()
                row[side], row[f"{side}_records"] = timed_rate(model, source, batch, options, args.repeats)
            for key, variable, value, kinds in asked:
                if kind in kinds:
                    with mock.patch.dict(os.environ, {variable: value}):  # restored after, whatever it was
                        row[key], records = timed_rate(model, source, batch, options, args.repeats)
                    row[f"{key}_detections"] = same_detections(records, row["stock_records"])
            row["detections"] = same_detections(row.pop("ours_records"), row.pop("stock_records"))
            row["decode_only"] = decode_rate(source)
            if "gpu_video" in row:
                row["nvdec_decode_only"] = nvdec_decode_rate(paths[0])
            row["in_memory"] = in_memory_rate(model, decoded(kind.split()[0], paths), batch, options, args.repeats)
            row["ceiling"] = min(row["decode_only"], row["in_memory"])
            rows.append(row)
            print(f"  {kind} batch {batch}: stock {row['stock']:.0f}, ours {row['ours']:.0f} img/s "
                  f"(ceiling {row['ceiling']:.0f})", flush=True)
        sides = ("imports", "stock", "ours") if args.memory_paths else ()
        memory = {side: peak_memory_mb(side, data["memory list"]) for side in sides}
    return rows, memory, threads


def markdown(rows: list[dict], memory: dict, threads: int, args) -> str:
    lines = [
        f"{environment_line()} | {os.cpu_count()} CPUs, {threads} decoder threads | model {args.model} | "
        f"{args.images} JPEGs ({', '.join(args.sizes)}), clips of {args.frames} frames",
        "",
        "| source | batch | stock img/s | ours img/s | speed-up | decode-only img/s | in-memory img/s (ours) | "
        "ours / ceiling | same paths, counts | max box diff (px) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        detections = row["detections"]
        same = "yes" if detections["same_paths"] and detections["same_counts"] else "NO"
        lines.append(
            f"| {row['source']} | {row['batch']} | {row['stock']:.0f} | {row['ours']:.0f} | "
            f"{row['ours'] / row['stock']:.2f}x | {row['decode_only']:.0f} | {row['in_memory']:.0f} | "
            f"{row['ours'] / row['ceiling']:.0%} | {same} | {detections['max_box_diff_px']:.2g} |"
        )
    for key, variable, value, _ in variants():
        for row in (row for row in rows if key in row):
            detections = row[f"{key}_detections"]
            lines.append(
                f"\n{row['source']} batch {row['batch']} with {variable}={value}: {row[key]:.0f} img/s "
                f"({row[key] / row['stock']:.2f}x stock, ours {row['ours']:.0f}); boxes {detections['ours']} "
                f"vs stock's {detections['stock']}, same counts per image: {detections['same_counts']}, max box diff "
                f"{detections['max_box_diff_px']:.3g} px (untied {detections['max_box_diff_px_untied']:.3g})"
            )
    for row in (row for row in rows if "nvdec_decode_only" in row):
        ceiling = min(row["nvdec_decode_only"], row["in_memory"])
        lines.append(f"\n{row['source']} batch {row['batch']}: NVDEC decode-only {row['nvdec_decode_only']:.0f} "
                     f"frames/s (with the pinned host copy); ours with NVDEC at {row['gpu_video'] / ceiling:.0%} of "
                     f"min(that, in-memory {row['in_memory']:.0f})")
    if memory:
        lines += ["", f"Peak host memory loading a list of {args.memory_paths} paths (640x480): stock "
                      f"{memory['stock']:.0f} MB, ours {memory['ours']:.0f} MB (batch 64; the imports alone: "
                      f"{memory['imports']:.0f} MB)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench sources", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="yolov8s.yaml")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--sizes", nargs="+", default=[f"{w}x{h}" for w, h in SIZES])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--video-batches", type=int, nargs="+", default=[1, 8])
    kinds = ["list", "folder", "video"]
    parser.add_argument("--sources", nargs="+", default=kinds, choices=kinds, help="which cases to run")
    parser.add_argument("--gpu-jpeg", action="store_true", help="also time the folder with nvJPEG decoding (opt-in)")
    parser.add_argument("--gpu-video", action=argparse.BooleanOptionalAction, default=None,
                        help="also time H.264 clips with NVDEC decoding (default: where PyNvVideoCodec loads)")
    parser.add_argument("--nice-off", action="store_true",
                        help="also time ours on the list and folder with the decoders at the predictor's priority")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-paths", type=int, default=2000, help="0 skips the memory measurement")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--keep", type=Path, help="write the data here and keep it")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument("--measure-memory", nargs=2, metavar=("SIDE", "LIST"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_memory:
        _measure_memory(*args.measure_memory)
        return
    rows, memory, threads = run(args)
    print(markdown(rows, memory, threads, args))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "memory_mb": memory, "threads": threads}, indent=1))


if __name__ == "__main__":
    main()
