"""``bench e2e`` and ``benchmarks/plot_e2e.py``: the detection comparison, and a tiny CPU run through both (the
benchmark proper needs a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ultralytics.engine.results import Boxes, Results

from conftest import HAS_CUDA, subprocess_env
from yolo_fastdetect.bench import e2e

REPO = Path(__file__).resolve().parents[1]


def results(*rows: list[float]) -> list[Results]:
    """One Results per argument, each a list of [x1, y1, x2, y2, conf, cls] rows."""
    made = []
    for boxes in rows:
        result = Results(orig_img=torch.zeros(100, 100, 3).numpy(), path="", names={0: "a", 1: "b"})
        result.boxes = Boxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 6), (100, 100))
        made.append(result)
    return made


def test_detection_difference():
    stock = results([[10, 10, 50, 50, 0.9, 0], [60, 60, 90, 90, 0.8, 1]], [])
    same = e2e.detection_difference(stock, stock)
    assert same == {"stock": 2, "ours": 2, "same_counts": True, "max_box_diff_px": 0.0, "max_box_diff_px_untied": 0.0,
                    "tied": 0}
    reordered = results([[60, 60, 90, 90.5, 0.8, 1], [10, 10, 50, 50, 0.9, 0]], [])
    assert e2e.detection_difference(reordered, stock)["max_box_diff_px"] == 0.5  # matched, not compared in order
    other_class = results([[10, 10, 50, 50, 0.9, 1], [60, 60, 90, 90, 0.8, 1]], [])
    assert e2e.detection_difference(other_class, stock)["max_box_diff_px"] == 50.0  # nearest box of its class
    other_conf = results([[10, 10, 50, 50, 0.5, 0], [60, 60, 90, 90, 0.8, 1]], [])
    assert e2e.detection_difference(other_conf, stock, conf_atol=0.01)["max_box_diff_px"] == float("inf")
    missing = results([[10, 10, 50, 50, 0.9, 0]], [[1, 1, 2, 2, 0.9, 0]])
    difference = e2e.detection_difference(missing, stock)
    assert not difference["same_counts"] and difference["max_box_diff_px"] == float("inf")


def test_detection_difference_sets_tied_scores_apart():
    """Where scores tie, which tied boxes NMS keeps is arbitrary: the untied boxes still have to agree."""
    stock = results([[10, 10, 50, 50, 0.9, 0], [0, 0, 20, 20, 0.5, 0], [60, 60, 90, 90, 0.5, 0]])
    ours = results([[10.5, 10, 50, 50, 0.9, 0], [0, 0, 20, 20, 0.5, 0], [0, 100, 20, 120, 0.5, 0]])
    difference = e2e.detection_difference(ours, stock)
    assert difference["max_box_diff_px"] == 70.0  # the third box is none of stock's
    assert difference["max_box_diff_px_untied"] == 0.5 and difference["tied"] == 2
    moved = results([[30, 10, 50, 50, 0.9, 0], [0, 0, 20, 20, 0.5, 0], [60, 60, 90, 90, 0.5, 0]])
    assert e2e.detection_difference(moved, stock)["max_box_diff_px_untied"] == 20.0  # an untied box that moved


@pytest.mark.skipif(HAS_CUDA, reason="checks the message given without a GPU")
def test_needs_a_gpu():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        e2e.main([])


def test_cpu_smoke_run_and_plot(tmp_path, capsys):
    raw = tmp_path / "e2e.json"
    e2e.main(["--device", "cpu", "--models", "yolo12n.yaml", "--batches", "1", "2", "--iters", "1", "--warmup", "1",
              "--json", str(raw)])
    assert "| yolo12n.yaml | 2 |" in capsys.readouterr().out
    data = json.loads(raw.read_text())
    assert [row["batch"] for row in data["rows"]] == [1, 2]
    for row in data["rows"]:
        assert row["detections"]["same_counts"] and row["detections"]["stock"] > 0
        assert row["detections"]["max_box_diff_px"] < 1e-3  # decode and NMS patched against stock, fp32
        assert row["ours"]["ms_per_image"] > 0 and set(row["ours"]["stages_ms_per_image"]) == set(e2e.STAGES)
    image = tmp_path / "e2e.png"
    plot = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plot_e2e.py"), str(raw), "--output", str(image)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    assert image.stat().st_size > 10_000


def test_compile_and_channels_last_rows(monkeypatch, capsys):
    """``--compile MODE`` and ``--channels-last``: per batch an eager row, then a row per mode, then one with
    ``channels_last=True``, each side from a new predictor (as a user's first call; a compiled side's own
    compilation counted in its warm-up) and with the package on for ours only."""
    import yolo_fastdetect

    calls = []

    def fake_time_predict(model, images, batch, device, warmup, iters, compile_mode=False, channels_last=None):
        calls.append((yolo_fastdetect.is_enabled(), compile_mode, channels_last, model.predictor is None))
        return {"ms_per_image": 1.0, "images_per_s": 1e3, "stages_ms_per_image": dict.fromkeys(e2e.STAGES, 0.3),
                "warmup_s": 2.5, "results": results([[10, 10, 50, 50, 0.9, 0]])}

    monkeypatch.setattr(e2e, "time_predict", fake_time_predict)
    monkeypatch.setattr(e2e, "detecting_model", lambda name: type("Model", (), {"predictor": "set up"})())
    e2e.main(["--device", "cpu", "--models", "yolo12n.yaml", "--batches", "1", "--compile", "true",
              "reduce-overhead", "--channels-last"])
    yolo_fastdetect.enable()
    assert calls == [(False, False, None, True), (True, False, None, True), (False, True, None, True),
                     (True, True, None, True), (False, "reduce-overhead", None, True),
                     (True, "reduce-overhead", None, True), (False, False, True, True), (True, False, True, True)]
    out = capsys.readouterr().out
    assert "| yolo12n.yaml | 1 | - |" in out and "| yolo12n.yaml | 1 | reduce-overhead |" in out
    assert "| yolo12n.yaml | 1 | channels_last |" in out
    assert "| 2.5 / 2.5 |" in out  # the warm-up column
