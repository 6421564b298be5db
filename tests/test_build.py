"""The JIT build: cached across processes, safe when two processes build at once, and a failed build leaves
Ultralytics running stock with one warning that names the compiler log."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import subprocess_env
from yolo_fastdetect import _ext

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


@pytest.mark.slow  # a cold build of the CPU operators: about a minute on 2 cores
def test_concurrent_builds_then_cached(tmp_path):
    """Two processes building into one empty cache both get a working library; a third one builds nothing."""
    first, second = run_python(DECODE_CHECK, tmp_path), run_python(DECODE_CHECK, tmp_path)
    outputs = [finish(first), finish(second)]
    libraries = {line for stdout, _ in outputs for line in stdout.splitlines() if line.startswith("library:")}
    assert len(libraries) == 1 and Path(libraries.pop().split(": ", 1)[1]).is_file()
    builds = [stderr for _, stderr in outputs if "building the operators" in stderr]
    assert builds, outputs
    count = len(_ext._sources(with_cuda=False))  # a progress line per compiled file, then the total time
    assert f"yolo_fastdetect: [{count}/{count}] " in builds[0] and "operators built in" in builds[0]

    stdout, stderr = finish(run_python(DECODE_CHECK, tmp_path))
    assert "library:" in stdout
    assert "building the operators" not in stderr


def test_failed_build_warns_once_and_runs_stock(tmp_path):
    stdout, _ = finish(run_python(FAILED_BUILD_PREDICT, tmp_path, YOLO_FASTDETECT_CXXFLAGS="-fno-such-flag-yfd"))
    lines = dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)
    assert lines["warnings"] == "1"
    assert "running stock Ultralytics" in lines["message"]
    log = Path(lines["message"].rsplit("Compiler output: ", 1)[1].strip())
    assert log.is_file() and "no-such-flag-yfd" in log.read_text()
    assert lines["boxes"] == "6"  # stock NMS output rows [x1, y1, x2, y2, conf, cls]


# ---- A damaged, read-only or unusable cache: the library loads, is rebuilt, or Ultralytics runs stock ----------

READONLY_MOUNT = "mount --bind {d} {d} && mount -o remount,bind,ro {d} {d} && exec \"$@\""


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory) -> Path:
    """A cache root holding a completed build of this machine's library (copied from this process's own cache, which
    CI filled with `yolo-fastdetect build`; built here if it is not there yet)."""
    library = _ext.build()
    root = tmp_path_factory.mktemp("built_cache")
    shutil.copytree(library.parent, root / library.parent.name)
    return root


def cache_copy(built_cache: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A fresh copy of the built cache: its root and its library."""
    root = tmp_path / "cache"
    shutil.copytree(built_cache, root)
    return root, root / _ext.library_path().parent.name / _ext.library_path().name


def run_in(cache: Path, code: str, readonly: bool = False, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``code`` (or ``-m yolo_fastdetect ARGS``) in a child Python on ``cache``; with ``readonly``, under a
    read-only bind mount of it in a mount namespace of its own."""
    command = [sys.executable, *(("-m", "yolo_fastdetect", *args) if args else ("-c", code))]
    if readonly:
        command = ["unshare", "-m", "sh", "-c", READONLY_MOUNT.format(d=cache), "sh", *command]
    env = subprocess_env(YOLO_FASTDETECT_CACHE=str(cache))
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


def readonly_mounts_work(folder: Path) -> bool:
    """Whether this machine lets a child mount ``folder`` read-only in a namespace of its own (root, or CI)."""
    if shutil.which("unshare") is None:
        return False
    result = subprocess.run(["unshare", "-m", "sh", "-c", READONLY_MOUNT.format(d=folder), "sh", "touch",
                             str(folder / "probe")], capture_output=True)
    return result.returncode != 0 and b"Read-only" in result.stderr


def listing(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_completed_library_loads_without_writing(built_cache, tmp_path):
    """A good library loads as it is: nothing in the cache is written (no lock, no log), nothing is compiled, and
    torch's "No CUDA runtime is found" line (cpp_extension's import) is not printed."""
    root, _ = cache_copy(built_cache, tmp_path)
    before = listing(root)
    result = run_in(root, DECODE_CHECK)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "building the operators" not in result.stderr and "No CUDA runtime" not in result.stderr
    assert listing(root) == before
    if readonly_mounts_work(tmp_path):
        result = run_in(root, DECODE_CHECK, readonly=True)  # the Docker case: built once, run read-only
        assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_library_is_rebuilt_never_loaded(built_cache, tmp_path, damage):
    root, library = cache_copy(built_cache, tmp_path)
    data = library.read_bytes()
    library.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(len(data)))
    result = run_in(root, "", args=("build",)) if damage == "garbage" else run_in(root, DECODE_CHECK)
    assert result.returncode == 0, result.stderr[-3000:]  # a bus error (rc -7) if the damaged file were loaded
    assert "building the operators" in result.stderr
    assert _ext.is_complete(library)
    assert "building the operators" not in run_in(root, DECODE_CHECK).stderr


def test_damaged_library_in_a_readonly_cache_runs_stock(built_cache, tmp_path):
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    if not readonly_mounts_work(probe_dir):
        pytest.skip("no read-only bind mount here (needs unshare -m and mount)")
    root, library = cache_copy(built_cache, tmp_path)
    library.write_bytes(library.read_bytes()[:4096])
    result = run_in(root, FAILED_BUILD_PREDICT, readonly=True)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert lines["warnings"] == "1" and "running stock Ultralytics" in lines["message"]
    assert "Read-only" in lines["message"] and lines["boxes"] == "6"


def test_unloadable_library_is_reported(built_cache, tmp_path):
    """A library whose build completed but which does not load: `info` says so, and predict warns once and runs
    stock."""
    root, library = cache_copy(built_cache, tmp_path)
    library.write_bytes(b"\x7fELF not really a library" * 100)
    (library.parent / _ext.MARKER_NAME).write_text(_ext._fingerprint(library))
    info = run_in(root, "", args=("info",))
    assert info.returncode == 0, info.stderr[-3000:]
    assert "NOT loadable" in info.stdout and "operators unavailable" in info.stdout
    result = run_in(root, FAILED_BUILD_PREDICT)
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert result.returncode == 0 and lines["warnings"] == "1" and lines["boxes"] == "6", result.stderr[-3000:]


@pytest.mark.parametrize("where", ["uncreatable", "a regular file"])
def test_unusable_cache_path_runs_stock(tmp_path, where):
    cache = Path("/proc/yolo_fastdetect_cache") if where == "uncreatable" else tmp_path / "file"
    if where == "a regular file":
        cache.write_text("not a folder")
    result = run_in(cache, FAILED_BUILD_PREDICT)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert lines["warnings"] == "1" and "running stock Ultralytics" in lines["message"] and lines["boxes"] == "6"
    log = Path(lines["message"].rsplit("Compiler output: ", 1)[1].strip())
    assert log.is_file() and not log.is_relative_to(cache)  # written to the temporary folder instead


def test_build_key_and_cuda_choice(monkeypatch, tmp_path):
    """One cache folder per source location (a checkout and an installed copy do not rebuild each other), and
    CUDA kernels only where a GPU is present or TORCH_CUDA_ARCH_LIST asks for them."""
    here = _ext.build_dir(False)
    shutil.copytree(_ext.source_dir(), tmp_path / "csrc")
    monkeypatch.setattr(_ext, "source_dir", lambda: tmp_path / "csrc")
    assert _ext.build_dir(False) != here and _ext.build_dir(False).parent == here.parent
    monkeypatch.setattr(_ext._toolkit, "find", lambda: _ext._toolkit.Toolkit(Path("/usr/local/cuda"), "13.0", "system"))
    monkeypatch.setattr(_ext.torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("YOLO_FASTDETECT_CPU_ONLY", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert not _ext._builds_cuda()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    assert _ext._builds_cuda()
    monkeypatch.setenv("YOLO_FASTDETECT_CPU_ONLY", "1")
    assert not _ext._builds_cuda()


def _matches(path: str, pattern: str) -> bool:
    """Whether ``path`` matches a package-data ``pattern`` as setuptools globs it (``*`` within one folder)."""
    parts, pattern_parts = path.split("/"), pattern.split("/")
    return len(parts) == len(pattern_parts) and all(map(fnmatch.fnmatchcase, parts, pattern_parts))


def test_every_source_file_is_packaged_and_in_the_build_key(monkeypatch, tmp_path):
    """Every file under csrc/ is installed with the package (pyproject's package data) and is part of the build key,
    so that a change to any of them, a header included, builds the operators anew."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["yolo_fastdetect.csrc"]
    shutil.copytree(_ext.source_dir(), tmp_path / "csrc", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(_ext, "source_dir", lambda: tmp_path / "csrc")
    files = sorted(path for path in (tmp_path / "csrc").rglob("*") if path.is_file())
    names = [path.relative_to(tmp_path / "csrc").as_posix() for path in files]
    assert "common.h" in names and "roi_align/roi_align_cuda.cu" in names
    assert [name for name in names if not any(_matches(name, pattern) for pattern in patterns)] == []
    key = _ext.build_dir(with_cuda=True)
    for path, name in zip(files, names):
        text = path.read_text()
        path.write_text(text + "\n// edited\n")
        assert _ext.build_dir(with_cuda=True) != key, f"{name} is not part of the build key"
        path.write_text(text)
    assert _ext.build_dir(with_cuda=True) == key


def test_arch_list_adds_the_gpus_present_once(monkeypatch):
    """The GPUs present join TORCH_CUDA_ARCH_LIST, except one the list already targets with arch-specific code
    (9.0a for an sm_90 GPU): a plain build beside it would double every CUDA compile."""
    monkeypatch.setattr(_ext.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_ext.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(_ext.torch.cuda, "get_device_capability", lambda index: [(9, 0), (8, 6)][index])
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    assert _ext.cuda_arch_list() == "8.6;9.0a"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0")
    assert _ext.cuda_arch_list() == "8.0;8.6;9.0"
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    assert _ext.cuda_arch_list() == "8.6;9.0"


def test_first_use_from_many_threads_loads_once(monkeypatch, tmp_path):
    """The operators' first use may come from several threads at once (a list of videos' readers): the library loads
    and its fake kernels register once, and every thread sees them loaded. The load is slowed so that without the
    lock all eight threads would load."""
    loads, hooks = [], []

    def slow_load(path):
        time.sleep(0.2)
        loads.append(path)

    monkeypatch.setitem(_ext._state, "loaded", None)
    monkeypatch.setattr(_ext, "library_path", lambda: tmp_path / "ops.so")
    monkeypatch.setattr(_ext, "is_complete", lambda library: True)
    monkeypatch.setattr(_ext.torch.ops, "load_library", slow_load)
    monkeypatch.setattr(_ext, "_load_hooks", [lambda: hooks.append(1)])
    start = threading.Barrier(8)

    def first_use():
        start.wait()
        return _ext.available()

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda _: first_use(), range(8))) == [True] * 8
    assert len(loads) == 1 and len(hooks) == 1
