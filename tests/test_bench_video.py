"""``bench video``: a tiny CPU run through the whole benchmark (its GPU rows skip with their reason), its records,
and their rendering into RESULTS.md."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from yolo_fastdetect.bench import video

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["--device", "cpu", "--model", "yolov8n.yaml", "--imgsz", "160", "--one-stream-size", "160x96",
         "--many-streams-size", "128x72", "--frames", "6", "--many-frames", "4", "--streams", "2", "--batch", "2",
         "--live-frames", "3", "--repeats", "1"]


def test_help_exits_0(capsys):
    with pytest.raises(SystemExit) as exit_info:
        video.main(["--help"])
    assert exit_info.value.code == 0
    assert "--many-streams-size" in capsys.readouterr().out


def test_paced_releases_frames_at_the_source_rate():
    frames = [object()] * 4
    released = [release for release, _ in video.paced(frames, fps=50.0)]
    gaps = [later - earlier for earlier, later in zip(released, released[1:])]
    assert gaps == pytest.approx([0.02] * 3, abs=1e-9)


def test_cpu_smoke_run_and_records(tmp_path):
    pytest.importorskip("av")
    records = tmp_path / "video.json"
    video.main([*SMOKE, "--phases", "--json", str(records)])
    made = json.loads(records.read_text())
    assert [record["config"]["scenario"] for record in made] == list(video.SCENARIOS)
    one, many, folder, live = made
    for record in made:
        assert record["benchmark"] == "video" and record["table"] == "cpu" and record["gpu"] is None
        for key in ("date", "commit", "torch", "config", "figures"):
            assert record.get(key), key
        assert record["figures"]["host_other_cores"] >= 0 and 0 <= record["figures"]["host_steal_percent"] <= 100
    assert one["config"] == {"scenario": "one_stream", "streams": 1, "size": "160x96", "frames": 6, "batch": 2}
    assert many["config"]["streams"] == 2 and live["config"]["batch"] == 1
    assert folder["config"] == {**many["config"], "scenario": "folder"}
    for record in (one, many, folder):
        figures = record["figures"]
        assert figures["stock_fps"] > 0 and figures["ours_cpu_fps"] > 0
        assert figures["same_detections_cpu"] is True  # ours decodes on the CPU with stock's frames
        waits, *stages, rest = figures["ours_cpu_phases_us"]
        assert waits == -1 and all(stage > 0 for stage in stages)  # (no _prefetch on the CPU: waits not told)
        converted, converting, queue_waits = figures["ours_cpu_readers_us"]
        assert converted == converting == 0 and queue_waits > 0  # cv2 reads: its readers only wait on their queues
        predictor_off_cpu, readers_off_cpu = figures["ours_cpu_off_cpu_us"]
        assert predictor_off_cpu >= 0 and readers_off_cpu > 0  # (the readers block on their queues' room)
        assert ("ours_cpu_pinned_made_mb" in figures) == torch.cuda.is_available()  # only where pinned memory is
        assert "ours_nvdec_fps" not in figures and record["note"] == ("PyAV planes not run: no CUDA device; "
                                                                        "NVDEC not run: no CUDA device")
    assert one["figures"]["cv2_decode_fps"] > 0
    assert many["figures"]["cv2_threads_decode_fps"] > 0 and many["figures"]["cv2_processes_decode_fps"] > 0
    for side in ("stock", "ours"):
        median, p95 = live["figures"][f"{side}_latency_ms"]
        assert 0 < median <= p95

    spec = importlib.util.spec_from_file_location("render_results", REPO / "benchmarks" / "render_results.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    page = render.render(made)
    assert "## Video (`bench video`)" in page
    assert f"| one_stream | 1x 160x96, 6 frames | 2 | {one['figures']['stock_fps']:.0f} |" in page
    assert "NVDEC not run: no CUDA device." in page


def test_predict_phases_add_up_to_the_pass(monkeypatch):
    """The split of a pass adds up to its wall time per frame; the batch waits are those on stock's ``_prefetch``,
    told only where the pass read through it."""
    import time

    from ultralytics.engine import predictor

    from yolo_fastdetect.bench import _predict_phases

    class Result:
        speed = {"preprocess": 1.0, "inference": 2.0, "postprocess": 0.5}
        boxes = type("Boxes", (), {"cpu": lambda self: self})()

    def slow():
        for _ in range(3):
            time.sleep(0.02)  # the source's batch
            yield "batch"

    class Model:
        def __init__(self, prefetch):
            self.prefetch = prefetch

        def predict(self, source, stream, batch, **options):
            batches = predictor._prefetch(slow()) if self.prefetch else slow()
            for _ in batches:
                yield Result()

    for prefetch in (True, False):
        begin = time.perf_counter()
        phases, readers, off_cpu = _predict_phases.predict_phases(Model(prefetch), "clip.mp4", 1, {"device": "cpu"})
        wall_us = (time.perf_counter() - begin) * 1e6 / 3
        assert readers == dict.fromkeys(_predict_phases.READER_PHASES, 0.0)  # no video reader ran
        # The predictor's thread sleeps for each batch, or blocks on the prefetch queue while another thread sleeps.
        assert 0.015e6 <= off_cpu["predictor"] <= wall_us and off_cpu["readers"] == 0
        assert list(phases) == list(_predict_phases.PREDICT_PHASES)
        assert phases["preprocess"] == 1000 and phases["inference"] == 2000 and phases["postprocess"] == 500
        # The split adds up to the pass's own wall time: at least each frame's 20 ms batch, at most the call's time
        # measured around it (which also holds the set-up of the timers, a few ms on a busy machine).
        assert 0.02e6 <= sum(value or 0 for value in phases.values()) <= wall_us
        if prefetch:
            assert phases["batch waits"] >= 0.015e6  # each batch takes 20 ms to come, and nothing overlaps it
        else:
            assert phases["batch waits"] is None


def test_reader_times_count_pyavs_decoding_and_conversion(tmp_path):
    """PyAV's frames count as time in the decoder, their batched conversion as part of it."""
    pytest.importorskip("av")
    from video_corpus import write_h264
    from yolo_fastdetect import _ext
    from yolo_fastdetect.bench import _predict_phases
    from yolo_fastdetect.sources.av_planes import PlanesVideo

    if not _ext.available():
        pytest.skip("operators not built")
    path = write_h264(tmp_path / "clip.mp4", 10, 96, 64)
    iterate, convert = PlanesVideo.__iter__, PlanesVideo._converted
    with _predict_phases.reader_times() as times:
        frames = list(PlanesVideo(str(path), "cpu"))
    assert len(frames) == 10
    decoder, converting, waits = (times[phase] for phase in _predict_phases.READER_PHASES)
    assert decoder > converting > 0 and waits == 0
    assert (PlanesVideo.__iter__, PlanesVideo._converted) == (iterate, convert)  # restored after the block


def test_readers_off_cpu_counts_a_reader_blocked_on_its_queue(tmp_path):
    """A video reader whose consumer is slow waits off the CPU for room in its queue, and that time is counted."""
    import time

    from video_corpus import write_h264
    from yolo_fastdetect.bench import _predict_phases
    from yolo_fastdetect.sources import video

    path = write_h264(tmp_path / "clip.mp4", 6, 96, 64)
    read_all = video._read_all
    with _predict_phases.readers_off_cpu() as seconds:
        reader = video.VideoReader([str(path)], vid_stride=1, gray=False, capacity=1)
        items = []
        while not items or items[-1] is not video.VIDEO_END and not getattr(items[-1], "last", False):
            time.sleep(0.05)  # the reader's queue holds one item: it blocks on each put meanwhile
            items.append(reader.get())
        reader.close()
    assert len(items) == 7  # the video's start and its six frames
    assert seconds[0] >= 0.15  # blocked for most of six 50 ms sleeps
    assert video._read_all is read_all  # restored after the block
