"""The JIT build: cached across processes, safe when two processes build at once, and a failed build leaves
Ultralytics running stock with one warning that names the compiler log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import subprocess_env

# Decodes random logits with the operator and checks them against the pure-PyTorch reference; prints the library.
DECODE_CHECK = """
import torch, yolo_fastdetect
from yolo_fastdetect import _ext
boxes, scores = torch.randn(2, 64, 91) * 3, torch.randn(2, 5, 91)
out = yolo_fastdetect.detect_decode(boxes, scores, [(7, 13)], [16])
ref = yolo_fastdetect.detect_decode_reference(boxes.double(), scores.double(), [(7, 13)], [16])
assert (out.double() - ref).abs().max() < 1e-3
print("library:", _ext.library_path())
"""

# Builds with a compiler flag that does not exist, then predicts with a YAML model: must warn once and run stock.
FAILED_BUILD_PREDICT = """
import warnings
import torch
from ultralytics import YOLO
from ultralytics.utils import ASSETS
import yolo_fastdetect
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = YOLO("yolo11n.yaml")
    for _ in range(2):
        results = model.predict(str(ASSETS / "bus.jpg"), imgsz=160, device="cpu", verbose=False)
ours = [str(w.message) for w in caught if "yolo_fastdetect" in str(w.message)]
print("warnings:", len(ours))
print("message:", ours[0] if ours else "")
print("boxes:", results[0].boxes.data.shape[1])
"""


def run_python(code: str, cache: Path, **extra_env: str) -> subprocess.Popen:
    env = subprocess_env(YOLO_FASTDETECT_CACHE=str(cache), YOLO_FASTDETECT_CPU_ONLY="1", **extra_env)
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(process: subprocess.Popen) -> tuple[str, str]:
    stdout, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, stderr[-3000:]
    return stdout, stderr


def test_concurrent_builds_then_cached(tmp_path):
    """Two processes building into one empty cache both get a working library; a third one builds nothing."""
    first, second = run_python(DECODE_CHECK, tmp_path), run_python(DECODE_CHECK, tmp_path)
    outputs = [finish(first), finish(second)]
    libraries = {line for stdout, _ in outputs for line in stdout.splitlines() if line.startswith("library:")}
    assert len(libraries) == 1 and Path(libraries.pop().split(": ", 1)[1]).is_file()
    assert any("building operators" in stderr for _, stderr in outputs)

    stdout, stderr = finish(run_python(DECODE_CHECK, tmp_path))
    assert "library:" in stdout
    assert "building operators" not in stderr


def test_failed_build_warns_once_and_runs_stock(tmp_path):
    stdout, _ = finish(run_python(FAILED_BUILD_PREDICT, tmp_path, YOLO_FASTDETECT_CXXFLAGS="-fno-such-flag-yfd"))
    lines = dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)
    assert lines["warnings"] == "1"
    assert "running stock Ultralytics" in lines["message"]
    log = Path(lines["message"].rsplit("Compiler output: ", 1)[1].strip())
    assert log.is_file() and "no-such-flag-yfd" in log.read_text()
    assert lines["boxes"] == "6"  # stock NMS output rows [x1, y1, x2, y2, conf, cls]
