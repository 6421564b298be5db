"""Find the CUDA toolkit that compiles the CUDA operators: ``CUDA_HOME``, else the system's, else PyPI's wheels.

A pip venv or a runtime-only CUDA image has no system toolkit, but PyPI ships one: ``cuda-toolkit[nvcc,cccl]``
(the ``[cuda]`` extra) installs nvcc, its compiler back end and the CUDA headers into
``site-packages/nvidia/cu13/{bin,include,lib,nvvm}``, beside the CUDA runtime that torch's own wheels installed
there. That tree differs from a system toolkit in two ways a build must make up for: nvcc's profile looks for its
headers under ``targets/<arch>/include``, which the wheels do not have, and the runtime library is there only as
``libcudart.so.13``, with no ``libcudart.so`` for ``-lcudart`` to find. CUDA 12's wheels (``nvidia/cuda_nvcc/``,
one folder per package) carry ptxas but no nvcc, so they cannot compile; they are recognised and refused by name.

The order is ``CUDA_HOME`` (or ``CUDA_PATH``), which always wins when set; then ``/usr/local/cuda`` and the nvcc on
``PATH``; then the wheels in site-packages. A toolkit whose CUDA major differs from torch's is refused.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

PIP_INSTALL_HINT = 'pip install "cuda-toolkit[nvcc,cccl]=={cuda}.*"'
SYSTEM_TOOLKITS = (Path("/usr/local/cuda"),)


class ToolkitError(RuntimeError):
    """No usable CUDA toolkit: the message says why and how to get one."""


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit to compile with.

    Attributes:
        home: The folder holding ``bin/nvcc``: what ``torch.utils.cpp_extension`` calls ``CUDA_HOME``.
        version: The CUDA version nvcc reports, e.g. ``"13.0"``.
        origin: Where it was found: ``"CUDA_HOME"``, ``"system"`` or ``"pip"``.
        include_dirs: Headers a pip toolkit keeps where nvcc does not look for them (``include/cccl``).
        runtime_library: The CUDA runtime (``libcudart.so*``) to link against.
    """

    home: Path
    version: str
    origin: str
    include_dirs: list[Path] = field(default_factory=list)
    runtime_library: Path | None = None

    def describe(self) -> str:
        """``CUDA 13.0 from pip (/venv/.../nvidia/cu13)``."""
        return f"CUDA {self.version} from {self.origin} ({self.home})"


def torch_cuda() -> str | None:
    """The CUDA version torch was built with (``"13.0"``), or None for a CPU build of torch."""
    return torch.version.cuda


def install_hint() -> str:
    """The one command that installs a toolkit matching torch's CUDA version."""
    cuda = torch_cuda() or "13.0"
    if cuda.split(".")[0] == "12":
        return (f"install a CUDA {cuda} toolkit (NVIDIA's, conda's cuda-nvcc or a -devel image): PyPI's CUDA 12 "
                f"wheels carry no nvcc")
    return PIP_INSTALL_HINT.format(cuda=cuda)


def _nvcc_version(nvcc: Path) -> str:
    """``"13.0"`` from ``nvcc --version``; raises ToolkitError when nvcc cannot run."""
    try:
        output = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise ToolkitError(f"{nvcc} cannot run ({type(error).__name__}: {error})") from error
    match = re.search(r"release (\d+\.\d+)", output)
    if match is None:
        raise ToolkitError(f"{nvcc} --version does not name a CUDA release: {output.strip()[:200]!r}")
    return match.group(1)


def _runtime_library(folders: list[Path]) -> Path | None:
    """The CUDA runtime shared library in the first of ``folders`` that has one (``libcudart.so`` first)."""
    for folder in folders:
        candidates = sorted(folder.glob("libcudart.so*"), key=lambda path: len(path.name))
        if candidates:
            return candidates[0]
    return None


def _site_dirs() -> list[Path]:
    """Folders Python imports from (site-packages, ``--target`` folders on ``PYTHONPATH``), in import order."""
    return [Path(entry) for entry in dict.fromkeys(sys.path) if entry and Path(entry).is_dir()]


def _pip_trees() -> list[Path]:
    """Toolkit trees installed by PyPI's wheels: CUDA 13's ``nvidia/cu13`` and CUDA 12's ``nvidia/cuda_nvcc``."""
    trees = []
    for site in _site_dirs():
        trees += sorted((site / "nvidia").glob("cu[0-9]*")) + [site / "nvidia" / "cuda_nvcc"]
    return [tree for tree in trees if (tree / "bin").is_dir()]


def _toolkit_at(home: Path, origin: str) -> Toolkit:
    """The toolkit in ``home``, checked: nvcc runs and its CUDA major is torch's. Raises ToolkitError."""
    if not home.is_dir():  # only a folder the user named is tried without being there
        raise ToolkitError(f"CUDA_HOME={home} does not exist")
    nvcc = home / "bin" / "nvcc"
    if not nvcc.is_file():
        wheel_note = " (PyPI's CUDA 12 nvcc wheel ships only ptxas)" if home.name == "cuda_nvcc" else ""
        raise ToolkitError(f"no nvcc in {home / 'bin'}{wheel_note}")
    if not os.access(nvcc, os.X_OK):
        raise ToolkitError(f"{nvcc} is not executable")
    version = _nvcc_version(nvcc)
    wanted = torch_cuda()
    if wanted and version.split(".")[0] != wanted.split(".")[0]:
        raise ToolkitError(f"the toolkit in {home} is CUDA {version} but torch is built for CUDA {wanted}")
    include_dirs = [home / "include" / "cccl"] if origin == "pip" and (home / "include" / "cccl").is_dir() else []
    # The runtime beside nvcc, else the one torch's own wheels installed (the toolkit may sit in another folder).
    wheel_runtimes = [site / "nvidia" / folder / "lib" for site in _site_dirs()
                      for folder in (f"cu{version.split('.')[0]}", "cuda_runtime")]
    runtime_folders = [home / "lib64", home / "lib", *wheel_runtimes]
    return Toolkit(home, version, origin, include_dirs, _runtime_library(runtime_folders))


def _candidates() -> list[tuple[Path, str]]:
    """Toolkit folders to try, in order, with their origin."""
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            return [(Path(os.environ[variable]), "CUDA_HOME")]  # set by the user: the only one tried
    system = list(SYSTEM_TOOLKITS)
    nvcc = shutil.which("nvcc")
    if nvcc:  # often a link into a toolkit; a wrapper script resolves to a folder without one, and is skipped
        system.append(Path(nvcc).resolve().parent.parent)
    return [*((home, "system") for home in dict.fromkeys(system)), *((tree, "pip") for tree in _pip_trees())]


@functools.lru_cache(maxsize=1)
def find() -> Toolkit:
    """The toolkit to compile the CUDA sources with (cached for the process).

    Returns:
        The first usable toolkit of ``CUDA_HOME``/``CUDA_PATH`` (the only one tried when set), the system's
        (``/usr/local/cuda``, nvcc on ``PATH``) and PyPI's wheels in site-packages.

    Raises:
        ToolkitError: torch is a CPU build, or no usable toolkit was found; the message names each refusal (a
            folder without nvcc, an nvcc that cannot run, a CUDA major other than torch's) and the fix.

    Examples:
        >>> from yolo_fastdetect import _toolkit
        >>> _toolkit.find().describe()  # doctest: +SKIP
        'CUDA 13.0 from pip (/venv/lib/python3.12/site-packages/nvidia/cu13)'
    """
    if torch_cuda() is None:
        raise ToolkitError("torch is a CPU build (torch.version.cuda is None)")
    refusals = []
    for home, origin in _candidates():
        if origin != "CUDA_HOME" and not home.is_dir():
            continue  # nothing there: not worth a line
        try:
            return _toolkit_at(home, origin)
        except ToolkitError as refusal:
            refusals.append(str(refusal))
    reasons = "; ".join(refusals) if refusals else "no nvcc in CUDA_HOME, /usr/local/cuda, PATH or site-packages"
    raise ToolkitError(f"no usable CUDA toolkit ({reasons}); {install_hint()}")


def link_folder(toolkit: Toolkit, build_directory: Path) -> Path | None:
    """A folder for ``-L`` that holds ``libcudart.so``, which torch links with ``-lcudart``.

    None when the toolkit has an unversioned ``libcudart.so`` already (a system toolkit); for PyPI's runtime, which
    has only ``libcudart.so.13``, a link named ``libcudart.so`` to it, made in the build directory (site-packages
    may be read-only). The library loads by its soname either way, the one torch has loaded already.
    """
    library = toolkit.runtime_library
    if library is None or library.name == "libcudart.so":
        return None
    folder = build_directory / "cudart"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "libcudart.so"
    if not link.is_symlink() or link.resolve() != library.resolve():
        link.unlink(missing_ok=True)
        link.symlink_to(library)
    return folder
