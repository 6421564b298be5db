"""``yolo-fastdetect check``: exit 0 with the kernels that ran and detections equal to stock's where the fast path is
active; exit 1 with the reason where it is not; a clear error for a bad argument."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import HAS_CUDA, subprocess_env


def run_check(*arguments: str, **environment: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "yolo_fastdetect", "check", *arguments]
    return subprocess.run(command, capture_output=True, text=True, env=subprocess_env(**environment), timeout=900)


@pytest.mark.parametrize("device", ["cpu", pytest.param("0", marks=pytest.mark.cuda)])
def test_check_passes_where_the_fast_path_runs(device):
    result = run_check(f"device={device}", "imgsz=320")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    out = result.stdout
    assert "decode yes | NMS yes" in out, out
    if device != "cpu":
        assert "letterbox yes | graphs yes" in out, out
    assert "detections (2 images, yolo11n.yaml, imgsz 320): equal to stock on 2/2 images" in out, out
    assert "batch 1: stock" in out and "batch 16: stock" in out, out
    assert out.rstrip().splitlines()[-1].startswith("OK: the fast path runs on")


def test_check_fails_with_the_reason_when_the_patch_is_off():
    result = run_check("device=cpu", YOLO_FASTDETECT="0")
    assert result.returncode == 1
    assert "FAIL: the fast path is not active on cpu: the patch is off (YOLO_FASTDETECT=0)" in result.stdout


@pytest.mark.skipif(HAS_CUDA, reason="the GPU is there")
def test_check_on_a_gpu_that_is_not_there_fails_cleanly():
    result = run_check("device=0")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "FAIL: device=0 asks for a CUDA device, and torch sees 0 of them" in result.stdout


def test_check_arguments():
    from yolo_fastdetect import check

    assert check.parse_arguments(["model=yolov8n.yaml", "device=cpu"]) == {"model": "yolov8n.yaml", "device": "cpu"}
    for bad in (["modle=x.yaml"], ["device"], ["imgsz="]):
        with pytest.raises(SystemExit, match="bad argument"):
            check.parse_arguments(bad)
    help_run = run_check("--help")
    assert help_run.returncode == 0 and help_run.stdout.startswith("usage: yolo-fastdetect check")
