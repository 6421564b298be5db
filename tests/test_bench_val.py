"""``bench val``: a tiny CPU run through the whole benchmark (the benchmark proper needs a GPU), its records, and
their rendering into RESULTS.md."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from conftest import HAS_CUDA
from yolo_fastdetect.bench import val

REPO = Path(__file__).resolve().parents[1]


def test_printed_as_ultralytics_prints():
    assert val.printed([0.50362, 0.0012345, 1.0, 0.0]) == ["0.504", "0.00123", "1", "0"]


@pytest.mark.skipif(HAS_CUDA, reason="checks the message given without a GPU")
def test_needs_a_gpu():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        val.main([])


def test_the_third_side_reads_with_stocks_loader(monkeypatch):
    """``--loader-ab``'s side runs with the package on and ``YOLO_FASTDETECT_SOURCES=0``, the others without it."""
    import yolo_fastdetect

    seen = []

    class Model:
        def val(self, **options):
            seen.append((options["name"], yolo_fastdetect.is_enabled(), os.environ.get("YOLO_FASTDETECT_SOURCES")))
            return "metrics"

    monkeypatch.delenv("YOLO_FASTDETECT_SOURCES", raising=False)
    for side in ("stock", "ours", val.STOCK_LOADER):
        seconds, metrics = val.val_once(Model(), Path("data.yaml"), {}, "cpu", side)
        assert seconds >= 0 and metrics == "metrics"
    yolo_fastdetect.enable()
    assert seen == [("stock", False, None), ("ours", True, None), (val.STOCK_LOADER, True, "0")]
    assert "YOLO_FASTDETECT_SOURCES" not in os.environ


def test_cpu_smoke_run_and_records(tmp_path, capsys):
    records = tmp_path / "val.json"
    records.write_text(json.dumps([{"benchmark": "val", "kept": True}]))
    val.main(["--device", "cpu", "--models", "yolo11n.yaml", "--images", "8", "--batch", "4", "--imgsz", "256",
              "--repeats", "1", "--warmup", "0", "--loader-ab", "--json", str(records)])
    assert "| yolo11n.yaml | fp32 |" in capsys.readouterr().out
    kept, record = json.loads(records.read_text())
    assert kept == {"benchmark": "val", "kept": True}  # appended, not overwritten
    assert record["benchmark"] == "val" and record["table"] == "cpu" and record["gpu"] is None
    assert record["config"] == {"model": "yolo11n.yaml", "images": 8, "batch": 4, "imgsz": 256, "precision": "fp32"}
    figures = record["figures"]
    assert figures["stock_ms_per_image"] > 0 and figures["ours_ms_per_image"] > 0
    assert figures["ours_stock_loader_ms_per_image"] > 0
    assert len(figures["stock_stages_ms"]) == len(figures["ours_stages_ms"]) == len(val.STAGES) + 1
    assert figures["same_printed_digits"] and figures["ours_metrics"] == figures["stock_metrics"]
    assert float(figures["stock_metrics"][1]) > 0  # the labels are the model's own boxes: it recalls some

    spec = importlib.util.spec_from_file_location("render_results", REPO / "benchmarks" / "render_results.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    page = render.render([record])
    assert "## Validation: `model.val` (`bench val`)" in page
    assert f"| yolo11n.yaml | fp32 | 8, 4, 256 | {figures['stock_ms_per_image']} |" in page
