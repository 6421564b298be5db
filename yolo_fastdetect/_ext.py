"""Build and load the C++/CUDA operators: the single place that knows whether they are available.

The extension is compiled on first use with ``torch.utils.cpp_extension`` and ninja against the torch installed
at run time, so it can never mismatch torch's ABI. Builds are cached under a directory keyed on the torch
version, the CUDA version, the target GPU architectures, the sources (their content and where they are) and the
CPU. A library is loaded only when the completion marker written after its link matches it (size and a hash of
its ends), so a partial or replaced file is rebuilt instead of crashing the process; a good library in a read-only
cache simply loads, without locking or writing anything. Concurrent builds are serialised by cpp_extension's file
lock in the cache directory. If the build or the load fails, the package warns once (naming the log file) and
Ultralytics runs stock.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch

from . import _toolkit, config

EXTENSION_NAME = "yolo_fastdetect_ops"
MARKER_NAME = "complete"  # written after a successful link: the library's fingerprint
# Hashed at each end of the library: 0.44 ms a check on the 2-core development machine, where hashing all of the
# 11 MB library took 21 ms; a truncation changes the size, a rewrite the ends.
_FINGERPRINT_BYTES = 1 << 18

_state: dict = {"loaded": None, "error": None, "log": None}
# Held while the operators build or load: the first calls may come from several threads at once (a list of videos'
# readers converting their first frames), and a second load registers the fake kernels twice, which raises.
_loading = threading.RLock()
_load_hooks: list = []


def on_load(hook):
    """Register ``hook()`` to run once the operators are loaded: fake kernels and autograd formulas can only be
    registered for an operator that exists, and the library is loaded lazily, on first use."""
    _load_hooks.append(hook)
    if _state["loaded"]:
        hook()
    return hook


def source_dir() -> Path:
    """Directory holding ``ops.cpp`` and one sub-directory per operator family.

    Installed wheels carry the sources as ``yolo_fastdetect/csrc``; a source checkout has them at ``csrc/``.
    """
    package_dir = Path(__file__).resolve().parent
    for candidate in (package_dir / "csrc", package_dir.parent / "csrc"):
        if (candidate / "ops.cpp").is_file():
            return candidate
    raise FileNotFoundError(f"yolo_fastdetect: C++ sources not found next to {package_dir}")


def _sources(with_cuda: bool) -> list[Path]:
    root = source_dir()
    sources = [root / "ops.cpp", *sorted(root.glob("*/*.cpp"))]
    if with_cuda:
        sources += sorted(root.glob("*/*.cu"))
    return sources


def _headers() -> list[Path]:
    """The headers the sources include: ``common.h``, each operator family's, and the CUDA-only ``.cuh``."""
    root = source_dir()
    return sorted([*root.glob("*.h"), *root.glob("*/*.h"), *root.glob("*/*.cuh")])


def toolkit_refusal() -> str | None:
    """Why no CUDA toolkit can build the CUDA sources (:class:`yolo_fastdetect._toolkit.ToolkitError`'s message,
    ending with the fix), or None when :func:`yolo_fastdetect._toolkit.find` finds one."""
    try:
        _toolkit.find()
    except _toolkit.ToolkitError as error:
        return str(error)
    return None


def cuda_toolkit() -> _toolkit.Toolkit | None:
    """The CUDA toolkit the build compiles with, or None when there is no usable one (:func:`toolkit_refusal`)."""
    return None if toolkit_refusal() else _toolkit.find()


def cuda_arch_list() -> str:
    """GPU architectures to build for: the GPUs present plus ``TORCH_CUDA_ARCH_LIST`` (sm_90 when neither names
    one, for an explicit CUDA build on a machine without a GPU)."""
    archs = {a for a in os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(",", ";").replace(" ", ";").split(";") if a}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            # A GPU the list already targets with arch-specific code ("9.0a" for an sm_90 GPU) needs no plain
            # build beside it: both for one GPU doubled the compile time of every CUDA source.
            if not {f"{major}.{minor}a", f"{major}.{minor}f"} & archs:
                archs.add(f"{major}.{minor}")
    return ";".join(sorted(archs)) or "9.0"


def cpu_flags() -> list[str]:
    """Compiler flags of the C++ sources: ``YOLO_FASTDETECT_CXXFLAGS`` if set (say, for a portable build without
    ``-march=native`` on a cluster of mixed CPUs), else code for this machine's instruction set (the cache key
    includes the CPU) with trapping math off, so that the CPU kernels' loops vectorise, and no fused multiply-add
    contraction, so that results round as torch's and torchvision's own CPU kernels do; OpenMP, which
    ``at::parallel_for`` needs to run on torch's intra-op threads. The C++ standard is left to torch (C++20 from
    2.13 on)."""
    return config.get("YOLO_FASTDETECT_CXXFLAGS").split()  # default: config.DEFAULT_CXXFLAGS


def _cpu_signature() -> str:
    """The CPU model and feature flags, which ``-march=native`` code depends on."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    return "".join(line for line in lines if line.startswith(("model name", "flags")))[:4096]


def cache_root() -> Path:
    """Where builds are cached: ``YOLO_FASTDETECT_CACHE``, else ``~/.cache/yolo_fastdetect``."""
    return config.get("YOLO_FASTDETECT_CACHE")


def build_dir(with_cuda: bool) -> Path:
    """Cache directory for this torch / CUDA / architecture / source combination."""
    root = cache_root()
    # The sources' folder is part of the key: ninja's build file names them by absolute path, so a checkout and an
    # installed copy sharing one folder rebuilt everything each time the other one ran.
    digest = hashlib.sha256(str(source_dir()).encode())
    for path in _sources(with_cuda) + _headers():
        digest.update(path.name.encode() + path.read_bytes())
    cuda_tag = f"cu{torch.version.cuda}-sm{cuda_arch_list().replace(';', '_')}" if with_cuda else "cpu"
    python_tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    digest.update((_cpu_signature() + " ".join(cpu_flags())).encode())
    return root / f"torch{torch.__version__}-{cuda_tag}-{python_tag}-{digest.hexdigest()[:12]}"


def _builds_cuda() -> bool:
    """Whether this machine's build compiles the CUDA sources: a toolkit exists, a GPU is present or
    ``TORCH_CUDA_ARCH_LIST`` asks for CUDA kernels (a Docker image, CI), and no CPU-only build was asked
    (``YOLO_FASTDETECT_CPU_ONLY=1``). Without a GPU the CPU-only build takes about half the time."""
    return _cuda_wanted() and _cpu_only_reason() is None and cuda_toolkit() is not None


def _cuda_wanted() -> bool:
    return torch.cuda.is_available() or bool(os.environ.get("TORCH_CUDA_ARCH_LIST"))


def _cpu_only_reason() -> str | None:
    """Why the build leaves out CUDA on purpose, or None."""
    return "YOLO_FASTDETECT_CPU_ONLY=1" if config.get("YOLO_FASTDETECT_CPU_ONLY") else None


def library_path() -> Path:
    """Where this machine's operator library is, or will be once built (nothing is compiled here)."""
    return build_dir(_builds_cuda()) / f"{EXTENSION_NAME}.so"


def _fingerprint(library: Path) -> str:
    """The library's size and a hash of its first and last bytes: what the completion marker records."""
    with open(library, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        ends = file.read(_FINGERPRINT_BYTES)
        file.seek(max(size - _FINGERPRINT_BYTES, 0))
        ends += file.read()
    return f"{size} {hashlib.sha256(ends).hexdigest()}"


def is_complete(library: Path) -> bool:
    """Whether ``library`` is the file its build completed: its marker matches it (never loads anything)."""
    try:
        return (library.parent / MARKER_NAME).read_text() == _fingerprint(library)
    except OSError:
        return False


def _compile(library: Path, with_cuda: bool, verbose: bool) -> None:
    """Compile and load the operators into ``library``, then write its completion marker (atomically)."""
    directory = library.parent
    directory.mkdir(parents=True, exist_ok=True)
    cflags = cpu_flags()
    ldflags = ["-fopenmp"] if "-fopenmp" in cflags else []
    cuda_cflags = ["-O3", "-lineinfo"]
    toolkit = _toolkit.find() if with_cuda else None
    if toolkit is not None:
        os.environ["CUDA_HOME"] = str(toolkit.home)  # before cpp_extension's import, which guesses one otherwise
    from torch.utils import cpp_extension  # only to compile: importing it without a GPU prints a CUDA warning

    if toolkit is not None:
        cpp_extension.CUDA_HOME = str(toolkit.home)
        os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch_list()
        for folder in toolkit.include_dirs:
            cuda_cflags += ["-isystem", str(folder)]
        link_folder = _toolkit.link_folder(toolkit, directory)
        ldflags += [f"-L{link_folder}"] if link_folder else []
    marker = directory / MARKER_NAME
    for stale in (marker, library):  # not a completed build: relinked (ninja would think it up to date), never loaded
        stale.unlink(missing_ok=True)
    sources = _sources(with_cuda)
    kernels = f"CPU+CUDA with {toolkit.describe()}" if toolkit else "CPU"
    print(f"yolo_fastdetect: building the operators once ({kernels}; {len(sources)} files) in {directory}",
          file=sys.stderr, flush=True)
    with _BuildProgress(directory, sources, quiet=verbose):
        cpp_extension.load(
            name=EXTENSION_NAME,
            sources=[str(s) for s in sources],
            extra_cflags=cflags,
            extra_ldflags=ldflags,
            extra_cuda_cflags=cuda_cflags,
            build_directory=str(directory),
            with_cuda=with_cuda,
            is_python_module=False,
            verbose=verbose,
        )
    written = marker.with_name(f"{MARKER_NAME}.{os.getpid()}")
    written.write_text(_fingerprint(library))
    os.replace(written, marker)


class _BuildProgress:
    """Prints a line on stderr as each source's object file appears, with counts and elapsed time, then the total.

    ninja runs the compilers on every core (``MAX_JOBS`` caps it) and keeps their output to itself unless the build
    is verbose; the object files it writes are what show that a file is done, whichever ninja or torch runs.
    """

    def __init__(self, directory: Path, sources: list[Path], quiet: bool, interval: float = 0.5) -> None:
        self.directory, self.quiet, self.interval = directory, quiet, interval
        self.names = {self._object_name(source): source.name for source in sources}
        self.done: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="yolo_fastdetect-build-progress", daemon=True)

    @staticmethod
    def _object_name(source: Path) -> str:
        """The object file cpp_extension names for ``source``: ``x.o``, or ``x.cuda.o`` for a ``.cu`` file."""
        return f"{source.stem}.cuda.o" if source.suffix == ".cu" else f"{source.stem}.o"

    def __enter__(self) -> _BuildProgress:
        self.start = time.monotonic()
        self.start_wall = time.time() - 1  # an object file older than this is a previous build's
        if not self.quiet:
            self.thread.start()
        return self

    def _watch(self) -> None:
        while not self.stop.wait(self.interval):
            self._report_finished()

    def _report_finished(self) -> None:
        """A line for each object file that appeared since the last look."""
        for name in sorted(self.names.keys() - self.done):
            try:
                fresh = (self.directory / name).stat().st_mtime >= self.start_wall
            except OSError:
                continue
            if fresh:
                self.done.add(name)
                print(f"yolo_fastdetect: [{len(self.done)}/{len(self.names)}] {self.names[name]} "
                      f"({time.monotonic() - self.start:.0f} s)", file=sys.stderr, flush=True)

    def __exit__(self, error_type, error, traceback) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        if error_type is None and not self.quiet:
            self._report_finished()  # the files finished since the watcher's last look
            print(f"yolo_fastdetect: operators built in {time.monotonic() - self.start:.0f} s", file=sys.stderr,
                  flush=True)


def build(verbose: bool = False) -> Path:
    """Load the operators, compiling them first unless a completed build is cached; return the shared library's
    path. Raises on failure."""
    library = library_path()
    with _loading:
        if _state["loaded"]:
            return library
        if is_complete(library):
            torch.ops.load_library(str(library))
        else:
            _compile(library, _builds_cuda(), verbose)
        _state.update(loaded=True, error=None)
        for hook in _load_hooks:
            hook()
    return library


def _write_error_log(error: BaseException) -> Path | None:
    """The failure's text in ``build_error.log`` in the cache, else in the temporary folder (the cache may be the
    very thing that cannot be written); None when neither can be written."""
    for folder in (cache_root(), Path(tempfile.gettempdir()) / "yolo_fastdetect"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            log = folder / "build_error.log"
            log.write_text(f"{type(error).__name__}: {error}\n")
            return log
        except OSError:
            continue
    return None


def _first_line(error: BaseException, limit: int = 200) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Both queries below are marked as constant results: the patched head asks them inside the network's forward, and
# torch.compile would otherwise trace into them, breaking the graph at the first call's file checks (pathlib) and at
# the dispatcher query. Marked, it calls them once, eagerly, while it traces, and keeps the answer as a constant:
# once loaded (or failed) the operators stay so for the life of the process.
@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the operators are loaded; builds them on first call, warns once and returns False on failure."""
    if _state["loaded"] is None:
        with _loading:
            if _state["loaded"] is None:  # (not settled by another thread meanwhile)
                try:
                    build()
                except Exception as error:  # noqa: BLE001 - any build/load failure must leave Ultralytics running stock
                    log = _write_error_log(error)
                    _state.update(loaded=False, error=error, log=log)
                    warnings.warn(
                        f"yolo_fastdetect: could not build or load the operators ({_first_line(error)}); "
                        f"running stock Ultralytics. Compiler output: {log or 'not written (no writable folder)'}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
    return bool(_state["loaded"])


@torch.compiler.assume_constant_result
def has_cuda_kernels() -> bool:
    """Whether the loaded library carries CUDA kernels (it was built with nvcc)."""
    return available() and torch._C._dispatch_has_kernel_for_dispatch_key("yolo_fastdetect::detect_decode", "CUDA")


def cuda_unavailable_reason() -> str | None:
    """Why a model on a CUDA device runs stock, ending with what fixes it; None when the CUDA kernels are loaded or
    will be built on first use. Never compiles: it reads the outcome of a build that ran.

    Examples:
        >>> from yolo_fastdetect import _ext
        >>> _ext.cuda_unavailable_reason()  # doctest: +SKIP
        'no usable CUDA toolkit (no nvcc in CUDA_HOME, ...); pip install "cuda-toolkit[nvcc,cccl]==13.0.*"'
    """
    if torch.version.cuda is None:
        return "torch is a CPU build; install a CUDA build of torch"
    if _state["loaded"] is False:
        return (f"the operators failed to build or load: {_first_line(_state['error'])}; compiler output in "
                f"{_state['log']}; `yolo-fastdetect build` retries and shows it")
    reason = _cpu_only_reason() or toolkit_refusal()
    if reason is None and _state["loaded"] and not has_cuda_kernels():
        reason = f"the library {library_path()} was built without CUDA kernels; `yolo-fastdetect build --cuda`"
    return reason


@torch.compiler.assume_constant_result
def cuda_fast_path() -> bool:
    """Whether the CUDA kernels run for a model on a CUDA device: :func:`has_cuda_kernels`, and where they are
    missing, one warning per process naming the cause and its fix (a failed build has warned already)."""
    if has_cuda_kernels():
        return True
    if _state["loaded"] and not _state.get("warned_stock_on_gpu"):
        _state["warned_stock_on_gpu"] = True
        warnings.warn(
            f"yolo_fastdetect: the model runs on a CUDA device, but the operators have no CUDA kernels, so Ultralytics "
            f"runs stock there: {cuda_unavailable_reason()}",
            RuntimeWarning,
            stacklevel=2,
        )
    return False


def require() -> None:
    """Raise a RuntimeError naming the build log when the operators cannot be built or loaded."""
    if not available():
        raise RuntimeError(f"yolo_fastdetect operators are unavailable: {_state['error']}")
