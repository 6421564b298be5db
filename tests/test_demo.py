"""demo/webcam.py, headless, on a short video written from the wheel's images; and its exit code 2 cases."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
import ultralytics

DEMO_DIR = Path(__file__).resolve().parents[1] / "demo"
ASSETS = Path(ultralytics.__file__).parent / "assets"


def run_script(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``demo/<script>`` with the test environment (offline); stdout and stderr separately."""
    environment = {key: value for key, value in os.environ.items() if key != "YOLO_FASTDETECT"}
    return subprocess.run([sys.executable, str(DEMO_DIR / script), *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=600)


def run_demo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_script("webcam.py", *args, cwd=cwd)


def test_headless_demo_writes_video_and_summary(tmp_path):
    assert run_script("make_clip.py", "clip.mp4", "--frames", "6", cwd=tmp_path).returncode == 0
    result = run_demo("--source", "clip.mp4", "--model", "yolo12n.yaml", "--device", "cpu", "--imgsz", "320",
                      "--headless", "--output", "out.mp4", "--frames", "4", "--warmup", "1",
                      "--save-frame", "1", "--save-dir", "shots", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = r"webcam demo: 4 frames, patched: mean [\d.]+ FPS, median [\d.]+ FPS"
    assert re.search(summary, result.stdout), result.stdout
    output = cv2.VideoCapture(str(tmp_path / "out.mp4"))
    assert int(output.get(cv2.CAP_PROP_FRAME_COUNT)) == 4
    assert cv2.imread(str(tmp_path / "shots" / "frame_00001.jpg")) is not None

    beyond = run_demo("--source", "clip.mp4", "--model", "yolo12n.yaml", "--device", "cpu", "--imgsz", "160",
                      "--headless", "--frames", "2", "--warmup", "1", "--save-frame", "5", cwd=tmp_path)
    assert beyond.returncode == 0, beyond.stderr
    assert "webcam demo: frame 5 not saved: the run ended after 2 frames" in beyond.stderr


@pytest.mark.parametrize("argument", [("--frames", "0"), ("--frames", "-1"), ("--save-frame", "-3")])
def test_counts_below_their_minimum_are_rejected(tmp_path, argument):
    result = run_demo("--source", str(ASSETS / "bus.jpg"), "--headless", *argument, cwd=tmp_path)
    assert result.returncode == 2 and "must be at least" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_device_without_a_gpu_exits_2_with_one_message(tmp_path):
    result = run_demo("--source", str(ASSETS / "bus.jpg"), "--model", "yolo12n.yaml", "--device", "cuda",
                      "--headless", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "webcam demo: --device cuda: torch sees no CUDA GPU here" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("missing.mp4", "source not found: missing.mp4"),
        ("not_a_video.mp4", "cannot open video not_a_video.mp4"),
        ("99", "cannot open camera 99"),
        ("empty_folder", "no images"),
    ],
)
def test_unusable_source_exits_2_with_one_message(tmp_path, source, message):
    (tmp_path / "not_a_video.mp4").write_bytes(b"not a video")
    (tmp_path / "empty_folder").mkdir()
    result = run_demo("--source", source, "--headless", cwd=tmp_path)
    assert result.returncode == 2
    assert f"webcam demo: {message}" in result.stderr
    assert "Traceback" not in result.stderr


def test_unloadable_model_exits_2_with_one_message(tmp_path):
    (tmp_path / "broken.pt").write_bytes(b"not a checkpoint")
    result = run_demo("--source", str(ASSETS / "bus.jpg"), "--model", "broken.pt", "--headless", cwd=tmp_path)
    assert result.returncode == 2
    assert "webcam demo: cannot load model broken.pt" in result.stderr
    assert "Traceback" not in result.stderr
