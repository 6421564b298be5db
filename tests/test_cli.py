"""The ``yolo-fastdetect`` console script and the ``YOLO_FASTDETECT=1 yolo`` start-up hook, run as a user runs them.

Each case starts a process (a few seconds each: torch and Ultralytics import, a random-weight yolo12n at 320).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
import ultralytics

import yolo_fastdetect
from yolo_fastdetect import cli

BUS = Path(ultralytics.__file__).parent / "assets" / "bus.jpg"
PATCH_ON = f"yolo_fastdetect {yolo_fastdetect.__version__}: patch on"


def not_installed(reason: str) -> None:
    """Skip where the package was not pip-installed; fail under CI (``.ci/run`` installs it, so it must be there)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}, but .ci/run installs it")
    pytest.skip(reason)


def console_script(name: str) -> str:
    """Path of an installed console script of this interpreter's environment."""
    path = Path(sys.executable).with_name(name)
    if not path.is_file():
        not_installed(f"{name} is not installed (pip install -e .)")
    return str(path)


def run(command: list[str], cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """Run ``command`` offline with Ultralytics' log on (its messages are what the tests read); stdout+stderr."""
    environment = {key: value for key, value in os.environ.items() if key != "YOLO_FASTDETECT"}
    environment.update(YOLO_VERBOSE="true", **env)
    return subprocess.run(command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)


def predict_args(project: Path, name: str) -> list[str]:
    return ["predict", "model=yolo12n.yaml", f"source={BUS}", "imgsz=320", f"project={project}", f"name={name}"]


def assert_saved_annotated_bus(run_dir: Path) -> None:
    saved = cv2.imread(str(run_dir / "bus.jpg"))
    assert saved is not None, f"no annotated image in {run_dir}"
    assert saved.shape == cv2.imread(str(BUS)).shape


def test_console_script_predicts_like_yolo(tmp_path):
    result = run([console_script("yolo-fastdetect"), *predict_args(tmp_path, "run")])
    assert result.returncode == 0, result.stdout
    assert PATCH_ON in result.stdout
    assert "Results saved to" in result.stdout  # Ultralytics took it for a CLI run
    assert_saved_annotated_bus(tmp_path / "run")


def test_info_reports_patch_state():
    script = console_script("yolo-fastdetect")
    on, off = run([script, "info"]), run([script, "info"], YOLO_FASTDETECT="0")
    assert on.returncode == 0 and off.returncode == 0, on.stdout + off.stdout
    assert "patch: on" in on.stdout
    assert "patch: off (YOLO_FASTDETECT=0)" in off.stdout
    assert "operators:" in on.stdout and "GPU:" in on.stdout


def test_plain_yolo_is_patched_only_with_the_variable(tmp_path):
    yolo = console_script("yolo")
    if cli.installed_hook() is None:
        not_installed(f"{cli.HOOK_FILE_NAME} is not installed in site-packages (pip install -e .)")
    patched = run([yolo, *predict_args(tmp_path, "patched")], YOLO_FASTDETECT="1")
    stock = run([yolo, *predict_args(tmp_path, "stock")])
    assert patched.returncode == 0 and stock.returncode == 0, patched.stdout + stock.stdout
    assert PATCH_ON in patched.stdout
    assert "yolo_fastdetect" not in stock.stdout
    assert_saved_annotated_bus(tmp_path / "patched")
    assert_saved_annotated_bus(tmp_path / "stock")


def test_export_runs_stock_and_says_so(tmp_path):
    result = run([console_script("yolo-fastdetect"), "export", "model=yolo12n.yaml", "format=torchscript",
                  "imgsz=64"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert "yolo_fastdetect: export runs stock Ultralytics" in result.stdout
    assert (tmp_path / "yolo12n.torchscript").is_file()


def test_output_into_a_reader_that_left_ends_quietly():
    """``yolo-fastdetect info | head -1``: the reader closes the pipe before the command writes; no traceback."""
    reader, writer = os.pipe()
    os.close(reader)
    with os.fdopen(writer, "w") as closed_pipe:
        result = subprocess.run([sys.executable, "-m", "yolo_fastdetect", "info"], stdout=closed_pipe,
                                stderr=subprocess.PIPE, text=True, timeout=600)
    assert result.returncode == 141, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr


def test_usage_and_unknown_benchmark(capsys):
    cli.main([])
    assert "yolo-fastdetect MODE [key=value ...]" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="usage: yolo-fastdetect bench NAME"):
        cli.main(["bench", "no_such_benchmark"])


def test_help_and_version_everywhere(capsys):
    """`--help` prints usage and exits 0 on every command (and builds nothing); `--version` names the versions."""
    from importlib.metadata import version

    for argv in (["--help"], ["-h"], ["build", "--help"], ["info", "-h"], ["bench", "--help"]):
        cli.main(argv)  # returns: exit status 0
        out = capsys.readouterr().out
        assert "usage" in out or "yolo-fastdetect" in out, argv
        assert "operators:" not in out and "building" not in out, argv
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "sources", "--help"])
    assert exit_info.value.code == 0 and "--batches" in capsys.readouterr().out
    cli.main(["--version"])
    versions = f"ultralytics {version('ultralytics')}, torch {version('torch')}"
    assert capsys.readouterr().out.strip() == f"yolo_fastdetect {yolo_fastdetect.__version__} ({versions})"
    with pytest.raises(SystemExit, match=r"usage: yolo-fastdetect build \[--cuda\]"):
        cli.main(["build", "now"])
    with pytest.raises(SystemExit, match="usage: yolo-fastdetect info"):
        cli.main(["info", "--cuda"])


def test_build_cuda_asks_for_cuda_kernels(monkeypatch, capsys):
    """`build --cuda` compiles CUDA kernels where no GPU is present (sm_90 unless TORCH_CUDA_ARCH_LIST names
    others), and says so when there is no toolkit."""
    from yolo_fastdetect import _ext

    wanted = []
    monkeypatch.setattr(_ext, "build", lambda: wanted.append(_ext._builds_cuda()) or Path("built.so"))
    monkeypatch.setattr(_ext.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(_ext._toolkit, "find", lambda: _ext._toolkit.Toolkit(Path("/usr/local/cuda"), "13.0", "system"))
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.delenv("YOLO_FASTDETECT_CPU_ONLY", raising=False)
    cli.main(["build"])
    cli.main(["build", "--cuda"])
    assert wanted == [False, True] and os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert "built.so" in capsys.readouterr().out
    def no_toolkit():
        raise _ext._toolkit.ToolkitError("no usable CUDA toolkit (no nvcc in CUDA_HOME, ...)")

    monkeypatch.setattr(_ext._toolkit, "find", no_toolkit)
    with pytest.raises(SystemExit, match="no usable CUDA toolkit"):
        cli.main(["build", "--cuda"])
