"""Finding a CUDA toolkit: ``CUDA_HOME`` first, then the system's, then PyPI's wheels; a refusal for each toolkit that
cannot build (no nvcc, an nvcc that cannot run, another CUDA major than torch's), and the warning a model on a CUDA
device gets when the operators have no CUDA kernels.

The wheel trees are real: ``.ci/run`` installs PyPI's CUDA 13 toolkit wheels (``nvidia/cu13``) and CUDA 12's
(``nvidia/cuda_nvcc``, ``nvidia/cuda_runtime``) into folders it names in ``YOLO_FASTDETECT_TEST_TOOLKITS``
(``cu13=PATH:cu12=PATH``); the tests that need them skip without it.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

from yolo_fastdetect import _ext, _toolkit, config


def wheel_site(name: str) -> Path:
    """The ``--target`` folder holding the ``name`` (cu13 or cu12) toolkit wheels; skips when not installed."""
    listed = config.get("YOLO_FASTDETECT_TEST_TOOLKITS")
    folders = dict(item.split("=", 1) for item in listed.split(":") if item)
    if name not in folders or not Path(folders[name]).is_dir():
        pytest.skip(f"no {name} toolkit wheels installed (YOLO_FASTDETECT_TEST_TOOLKITS, set by .ci/run)")
    return Path(folders[name])


@pytest.fixture
def only(monkeypatch):
    """Make ``folders`` the only places a toolkit is looked for: no CUDA_HOME, no system toolkit, no nvcc on PATH,
    ``sys.path`` just those folders; torch's CUDA version as given."""

    def isolate(*folders: Path, cuda: str = "13.0") -> None:
        for variable in ("CUDA_HOME", "CUDA_PATH"):
            monkeypatch.delenv(variable, raising=False)
        monkeypatch.setattr(_toolkit, "SYSTEM_TOOLKITS", ())
        monkeypatch.setenv("PATH", "/nonexistent")
        monkeypatch.setattr(sys, "path", [str(folder) for folder in folders])
        monkeypatch.setattr(torch.version, "cuda", cuda)
        _toolkit.find.cache_clear()

    yield isolate
    _toolkit.find.cache_clear()


def fake_toolkit(root: Path, nvcc_script: str | None, mode: int = 0o755) -> Path:
    """A toolkit folder whose ``bin/nvcc`` is ``nvcc_script`` (None: no nvcc at all)."""
    (root / "bin").mkdir(parents=True)
    if nvcc_script is not None:
        nvcc = root / "bin" / "nvcc"
        nvcc.write_text(nvcc_script)
        nvcc.chmod(mode)
    return root


NVCC_12_4 = "#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n"


def test_pip_cuda13_tree_is_found_and_links(only, tmp_path):
    """The CUDA 13 wheels' ``nvidia/cu13`` tree builds: nvcc runs, its CCCL headers are added where nvcc's profile does
    not look, and ``-lcudart`` finds a ``libcudart.so`` made in the build folder (the tree itself is not written)."""
    site = wheel_site("cu13")
    only(site)
    toolkit = _toolkit.find()
    assert (toolkit.origin, toolkit.home, toolkit.version) == ("pip", site / "nvidia" / "cu13", "13.0")
    assert toolkit.include_dirs == [site / "nvidia" / "cu13" / "include" / "cccl"]
    assert toolkit.runtime_library.name.startswith("libcudart.so.13")
    before = sorted(path.name for path in toolkit.runtime_library.parent.iterdir())
    link_folder = _toolkit.link_folder(toolkit, tmp_path / "build")
    assert (link_folder / "libcudart.so").resolve() == toolkit.runtime_library.resolve()
    assert _toolkit.link_folder(toolkit, tmp_path / "build") == link_folder  # made again: no error
    assert sorted(path.name for path in toolkit.runtime_library.parent.iterdir()) == before


def test_pip_cuda12_tree_has_no_nvcc(only):
    """CUDA 12's nvcc wheel (``nvidia/cuda_nvcc``) ships ptxas without nvcc: refused by name, with what to do."""
    site = wheel_site("cu12")
    assert (site / "nvidia" / "cuda_nvcc" / "bin" / "ptxas").is_file()
    only(site, cuda="12.8")
    with pytest.raises(_toolkit.ToolkitError, match="no nvcc in .*cuda_nvcc/bin .*ships only ptxas") as refusal:
        _toolkit.find()
    assert "install a CUDA 12.8 toolkit" in str(refusal.value)


def test_toolkit_of_another_major_is_refused(only):
    """A CUDA 13 toolkit for a torch built with CUDA 12.8 is refused, the message naming both versions."""
    only(wheel_site("cu13"), cuda="12.8")
    with pytest.raises(_toolkit.ToolkitError, match=r"is CUDA 13\.0 but torch is built for CUDA 12\.8"):
        _toolkit.find()


def test_system_before_pip_and_cuda_home_wins(only, monkeypatch, tmp_path):
    """The system toolkit comes before the wheels, a system toolkit of the wrong major falls through to them, and a
    set ``CUDA_HOME`` is the only one tried, even when it does not exist."""
    site = wheel_site("cu13")
    only(site)
    system = tmp_path / "system"
    system.symlink_to(site / "nvidia" / "cu13")
    monkeypatch.setattr(_toolkit, "SYSTEM_TOOLKITS", (system,))
    assert (_toolkit.find().origin, _toolkit.find().home) == ("system", system)
    old_system = fake_toolkit(tmp_path / "cuda-12.4", NVCC_12_4)
    monkeypatch.setattr(_toolkit, "SYSTEM_TOOLKITS", (old_system,))
    _toolkit.find.cache_clear()
    assert _toolkit.find().origin == "pip"
    monkeypatch.setenv("CUDA_HOME", str(system))
    _toolkit.find.cache_clear()
    assert (_toolkit.find().origin, _toolkit.find().home) == ("CUDA_HOME", system)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    _toolkit.find.cache_clear()
    with pytest.raises(_toolkit.ToolkitError, match="CUDA_HOME=.*nowhere does not exist"):
        _toolkit.find()


@pytest.mark.parametrize(
    ("nvcc_script", "mode", "reason"),
    [
        (None, 0o755, r"no nvcc in .*bin"),
        ("#!/bin/sh\necho 'Cuda compilation tools, release 13.0'\n", 0o644, "is not executable"),
        ("#!/nonexistent/interpreter\n", 0o755, "cannot run"),
        ("#!/bin/sh\necho 'not a compiler'\n", 0o755, "does not name a CUDA release"),
    ],
    ids=["no-nvcc", "not-executable", "cannot-run", "no-release"],
)
def test_broken_toolkits_are_refused_with_the_reason(only, monkeypatch, tmp_path, nvcc_script, mode, reason):
    """Each broken toolkit is one refusal in the error, which ends with the command that installs a good one."""
    home = fake_toolkit(tmp_path / "cuda", nvcc_script, mode)
    only()
    monkeypatch.setenv("CUDA_HOME", str(home))
    with pytest.raises(_toolkit.ToolkitError, match=reason) as refusal:
        _toolkit.find()
    assert str(refusal.value).endswith('pip install "cuda-toolkit[nvcc,cccl]==13.0.*"')


def test_no_toolkit_anywhere(only, tmp_path):
    only(tmp_path)
    with pytest.raises(_toolkit.ToolkitError, match="no nvcc in CUDA_HOME, /usr/local/cuda, PATH or site-packages"):
        _toolkit.find()


@pytest.fixture
def loaded_without_cuda(monkeypatch):
    """The state of a process whose operators loaded without CUDA kernels, the warning not given yet."""
    monkeypatch.setattr(_ext, "_state", {"loaded": True, "error": None, "log": None})
    monkeypatch.setattr(_ext, "has_cuda_kernels", lambda: False)
    monkeypatch.delenv("YOLO_FASTDETECT_CPU_ONLY", raising=False)


def test_stock_on_the_gpu_warns_once_with_cause_and_fix(only, loaded_without_cuda, tmp_path):
    """No toolkit: the first model on a CUDA device warns once, naming the cause and the command that fixes it."""
    only(tmp_path)
    assert _ext.cuda_unavailable_reason().startswith("no usable CUDA toolkit")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not _ext.cuda_fast_path()
        assert not _ext.cuda_fast_path()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "runs stock there: no usable CUDA toolkit" in messages[0]
    assert messages[0].endswith('pip install "cuda-toolkit[nvcc,cccl]==13.0.*"')


def test_reasons_for_a_cpu_only_build_and_a_failed_one(loaded_without_cuda, monkeypatch, tmp_path):
    """A CPU-only build asked for names its variable; a failed build names its log (it has warned already, so the
    GPU warning stays quiet); torch without CUDA says so."""
    monkeypatch.setenv("YOLO_FASTDETECT_CPU_ONLY", "1")
    assert _ext.cuda_unavailable_reason() == "YOLO_FASTDETECT_CPU_ONLY=1"
    log = tmp_path / "build_error.log"
    monkeypatch.setattr(_ext, "_state", {"loaded": False, "error": RuntimeError("ninja: build stopped"), "log": log})
    assert "failed to build or load: RuntimeError: ninja: build stopped" in _ext.cuda_unavailable_reason()
    assert str(log) in _ext.cuda_unavailable_reason()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not _ext.cuda_fast_path()
    assert caught == []
    monkeypatch.setattr(torch.version, "cuda", None)
    assert _ext.cuda_unavailable_reason().startswith("torch is a CPU build")


def test_gpu_state_line(monkeypatch, only, loaded_without_cuda, tmp_path):
    """The state ``info`` and the start-up line print: the stock reason where a GPU has no kernels."""
    from yolo_fastdetect import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.gpu_state() == "none visible"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    only(tmp_path)
    assert cli.gpu_state().startswith("stock (no usable CUDA toolkit")
