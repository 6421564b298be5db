"""benchmarks/RESULTS.md is generated: the committed page equals the rendering of benchmarks/records/."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def renderer():
    spec = importlib.util.spec_from_file_location("render_results", REPO / "benchmarks" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_is_the_records_rendering():
    render = renderer()
    expected = render.render(render.load())
    assert (REPO / "benchmarks" / "RESULTS.md").read_text() == expected, (
        "benchmarks/RESULTS.md differs from its records: run python benchmarks/render_results.py")
    assert len(expected.splitlines()) <= 250


def test_records_carry_their_run():
    for path in sorted((REPO / "benchmarks" / "records").glob("*.json")):
        for record in json.loads(path.read_text()):
            assert record["benchmark"] == path.stem
            for key in ("table", "date", "commit", "config", "figures", "torch"):
                assert record.get(key), (path.name, key, record)


def test_the_latest_record_of_a_configuration_wins():
    render = renderer()
    old = {"benchmark": "nms", "table": "gpu", "date": "2026-01-01", "commit": "a", "config": {"batch": 1}}
    new = {**old, "date": "2026-02-01", "commit": "b"}
    other = {**old, "config": {"batch": 2}}
    assert render.current([old, other, new]) == [new, other]
    assert render.current([new, old]) == [new]


def video_records() -> list[dict]:
    """GPU records of the three ``bench video`` scenarios, as the benchmark writes them (made-up figures)."""
    header = {"benchmark": "video", "table": "gpu", "date": "2026-12-06", "commit": "c", "gpu": "NVIDIA H200",
              "host": "16 CPU cores", "torch": "2.11.0+cu130", "cuda": "13.0", "ultralytics": "8.4.190"}
    return [
        {**header, "config": {"scenario": "one_stream", "streams": 1, "size": "720p", "frames": 300, "batch": 8},
         "figures": {"stock_fps": 250.0, "ours_cpu_fps": 640.0, "ours_pyav_fps": 1100.0, "ours_nvdec_fps": 1250.0,
                     "cv2_decode_fps": 800.0, "pyav_decode_fps": 1375.0, "nvdec_decode_fps": 1600.0,
                     "same_detections_cpu": True, "same_detections_pyav": True, "same_detections_nvdec": True}},
        {**header, "config": {"scenario": "many_streams", "streams": 8, "size": "1080p", "frames": 150, "batch": 8},
         "figures": {"stock_fps": 180.0, "ours_cpu_fps": 900.0, "ours_nvdec_fps": 1530.0,
                     "cv2_threads_decode_fps": 1000.0, "cv2_processes_decode_fps": 1200.0, "nvdec_decode_fps": 1800.0,
                     "same_detections_cpu": True, "same_detections_nvdec": False}},
        {**header, "config": {"scenario": "live_latency", "streams": 1, "size": "720p", "frames": 90, "batch": 1},
         "figures": {"stock_latency_ms": [7.46, 9.1], "ours_latency_ms": [2.54, 3.06], "source_fps": 30.0}},
    ]


def test_the_video_table_shows_each_path_against_its_ceiling():
    render = renderer()
    page = render.render(video_records())
    assert ("| one_stream | 1x 720p, 300 frames | 8 | 250 | 640 | 1100 | 1250 | 800 | 1375 | 1600 | "
            "cv2 80%, PyAV 80%, NVDEC 78% | yes / yes / yes |") in page
    # cv2 reading against the streams decoded in one process each, NVDEC against NVDEC alone; no PyAV side measured.
    assert ("| many_streams | 8x 1080p, 150 frames | 8 | 180 | 900 | - | 1530 | 1000 (8 threads), 1200 (8 processes) | "
            "- | 1800 | cv2 75%, NVDEC 85% | yes / - / no |") in page
    live = ("| live_latency | 720p, 90 frames at 30 FPS | 1 | 7.5 / 9.1 ms | 2.5 / 3.1 ms | - | - | - | - | - | - | "
            "- / - / - |")
    assert live in page


def test_results_md_keeps_room_for_the_video_table():
    render = renderer()
    assert len(render.render(render.load() + video_records()).splitlines()) <= 250


def test_a_table_from_several_machines_names_each_rows_gpu():
    render = renderer()
    mixed = video_records()
    mixed[0]["gpu"] = "NVIDIA H100 80GB HBM3"
    page = render.render(mixed)
    assert "| yes / yes / yes | 2026-12-06 c, NVIDIA H100 80GB HBM3 |" in page  # one_stream, on the H100
    assert "| - / - / - | 2026-12-06 c |" in page  # live_latency, on the default machine: untagged
    assert "unless noted; decode-only ceilings of the same run.\n" in page  # the intro names no machine
    # All on one other machine: the intro names it, the rows do not.
    alone = render.render([{**record, "gpu": "NVIDIA H100 80GB HBM3"} for record in video_records()])
    assert "NVIDIA H100 80GB HBM3, 16 CPU cores" in " ".join(alone.split()) and ", NVIDIA H100 80GB HBM3 |" not in alone
