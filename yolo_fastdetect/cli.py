"""The ``yolo-fastdetect`` console script: the ``yolo`` command with the patch on, plus commands of its own.

``yolo-fastdetect predict model=yolo12n.pt source=0 quantize=16`` (and ``val``, ``track``, ``train``, ``export``,
``help``, ...) takes exactly the ``yolo`` syntax and runs Ultralytics' own entrypoint, so saving, streaming, the
run folder and every message are those of ``yolo``. ``export`` runs stock: an exported model must not depend on
this package. The commands of its own are ``build``, ``info``, ``bench NAME`` and ``predict-many`` (Ray Data,
:mod:`yolo_fastdetect.ray.cli`).

``patch_yolo_command()`` is also what the start-up hook (``patches/yolo_fastdetect_hook.pth``) calls when the plain
``yolo`` command runs with ``YOLO_FASTDETECT=1``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import site
import sys
from pathlib import Path

HOOK_FILE_NAME = "yolo_fastdetect_hook.pth"

USAGE = """\
usage: yolo-fastdetect MODE [key=value ...]    the `yolo` command with yolo_fastdetect's kernels, e.g.
         yolo-fastdetect predict model=yolo12n.pt source=0 quantize=16
         yolo-fastdetect val model=yolo12n.pt data=coco8.yaml
         (`export` runs stock; `yolo-fastdetect help` shows Ultralytics' help)
       yolo-fastdetect predict-many model=... source=... output=... [key=value ...]
                                               predict a folder of images on a Ray cluster, one actor per GPU
                                               (the [ray] extra; `predict-many --help` lists its keys)
       yolo-fastdetect check [model=yolo11n.yaml] [device=0] [source=...]
                                               prove the fast path on this machine: which kernels ran, detections
                                               against stock, ms/img at batch 1 and 16 (exit 1 if it is off)
       yolo-fastdetect build [--cuda]          compile the operators now (--cuda: CUDA kernels without a GPU here,
                                               for TORCH_CUDA_ARCH_LIST or sm_90: a Docker image, say)
       yolo-fastdetect info                    versions, GPU, operators built, patch state, `yolo` hook
       yolo-fastdetect bench NAME [options]    run a benchmark of yolo_fastdetect.bench (`bench --help` lists them)
       yolo-fastdetect --version               this package's, Ultralytics' and torch's versions"""

HELP_FLAGS = ("-h", "--help")


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``yolo-fastdetect`` and ``python -m yolo_fastdetect``. Output piped into a reader that stops
    early (``| head``) ends the command quietly, as a shell tool does, not with a traceback."""
    try:
        _dispatch(sys.argv[1:] if argv is None else list(argv))
        sys.stdout.flush()  # here, so that a closed pipe is met inside the try, not at interpreter exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left for the exit's own flush
        raise SystemExit(141) from None  # 128 + SIGPIPE, a shell's status for a command whose reader left


def _dispatch(argv: list[str]) -> None:
    """Run the command ``argv`` names (see :data:`USAGE`)."""
    command = argv[0] if argv else "--help"
    if command in HELP_FLAGS:
        print(USAGE)
    elif command in ("-V", "--version"):
        print(version_line())
    elif command in ("build", "info"):
        options = {"build": ["--cuda"], "info": []}[command]
        if argv[1:2] and argv[1] in HELP_FLAGS:
            start = next(i for i, line in enumerate(USAGE.splitlines()) if f"yolo-fastdetect {command}" in line)
            print("\n".join(line.strip() for line in USAGE.splitlines()[start : start + 1 + len(options)]))
        elif any(arg not in options for arg in argv[1:]):
            raise SystemExit(f"usage: yolo-fastdetect {command} {' '.join(f'[{o}]' for o in options)}   "
                             f"(got {' '.join(argv[1:])})")
        elif command == "build":
            _build(cuda="--cuda" in argv[1:])
        else:
            _info()
    elif command == "check":
        from . import check

        raise SystemExit(check.main(argv[1:]))
    elif command == "bench":
        _bench(argv[1:])
    elif command == "predict-many":
        _predict_many(argv[1:])
    else:
        run_yolo(argv)


def version_line() -> str:
    """``yolo_fastdetect X.Y.Z (ultralytics A.B.C, torch T)``."""
    from importlib.metadata import version

    from . import __version__

    return f"yolo_fastdetect {__version__} (ultralytics {version('ultralytics')}, torch {version('torch')})"


def run_yolo(argv: list[str]) -> None:
    """Run ``yolo ARGV...`` (Ultralytics' ``ultralytics.cfg.entrypoint``) in this process with the patch on."""
    # Ultralytics treats a run as a CLI run (results saved, run folder printed) only when argv[0] ends in "yolo".
    # The list is changed in place because Ultralytics keeps a reference to it (ultralytics.utils.ARGV).
    sys.argv[:] = [os.path.join(os.path.dirname(sys.argv[0]), "yolo"), *argv]
    patch_yolo_command()

    from ultralytics.cfg import entrypoint

    entrypoint()


def patch_yolo_command() -> None:
    """Enable the patch for a ``yolo`` command run, say so in its log, and make ``export`` run stock (idempotent)."""
    from ultralytics.utils import LOGGER
    from ultralytics.utils.callbacks.base import default_callbacks

    import yolo_fastdetect  # importing enables the patch, unless YOLO_FASTDETECT=0

    if _export_runs_stock in default_callbacks["on_export_start"]:
        return  # already done: site-packages can be listed twice (lib and lib64), running the hook twice
    # Callbacks added here reach every model the entrypoint builds afterwards.
    default_callbacks["on_export_start"].append(_export_runs_stock)
    LOGGER.info(f"yolo_fastdetect {yolo_fastdetect.__version__}: patch {patch_state()}; GPU: {gpu_state()}")


def patch_state() -> str:
    """What runs, as logs and ``info`` print it: ``on (...)`` naming the patches that apply and why any other is off,
    a note where the Ultralytics release is untested, the operators' state unless they load (an unbuilt library is
    said to be so: nothing is compiled here), or ``off (why)``."""
    import yolo_fastdetect

    from . import _ext

    if yolo_fastdetect.is_enabled():
        from yolo_fastdetect import patches

        states = patches.states()
        on = [name for name, state in states.items() if state == "on"]
        off = [f"{name} {state}" for name, state in states.items() if state != "on"]
        state = f"on ({', '.join(on)})" + "".join(f"; {line}" for line in off)
        untested = patches.untested_note(patches.ultralytics_version())
        state += f"; {untested}" if untested else ""
        if not _ext.is_complete(_ext.library_path()):
            return f"{state}; operators not built yet (built on first use)"
        if not _ext.available():
            return (f"{state}; operators unavailable, so the Detect decode, NMS and letterbox run stock "
                    f"(log: {_ext._state['log']})")
        return state
    if not yolo_fastdetect._switched_on():
        return f"off (YOLO_FASTDETECT={os.environ.get('YOLO_FASTDETECT')})"
    from yolo_fastdetect import patches

    reasons = "; ".join(f"{name} {state}" for name, state in patches.states().items())
    return f"off (no patch applies to Ultralytics {patches.ultralytics_version() or '(none)'}: {reasons})"


def gpu_state() -> str:
    """What runs on a CUDA device, as logs, ``info`` and ``check`` print it: ``none visible``, ``CUDA kernels (...)``
    or ``stock (why; the fix)``. Never compiles anything."""
    import torch

    from . import _ext

    if not torch.cuda.is_available():
        return "none visible"
    reason = _ext.cuda_unavailable_reason()
    if reason is not None:
        return f"stock ({reason})"
    if _ext.is_complete(_ext.library_path()):
        return f"CUDA kernels for sm {_ext.cuda_arch_list()}"
    return f"CUDA kernels once built ({_ext.cuda_toolkit().describe()})"  # no reason: a toolkit was found


def _export_runs_stock(exporter) -> None:
    """``on_export_start`` callback: export the stock graph, never one that calls yolo_fastdetect's operators.

    The exporter's dry run comes before this callback, but it already takes the stock path: the patched head
    falls back to the original method in export mode.
    """
    from ultralytics.utils import LOGGER

    import yolo_fastdetect

    yolo_fastdetect.disable()
    LOGGER.info("yolo_fastdetect: export runs stock Ultralytics (patch off); the exported model does not need it")


def installed_hook() -> Path | None:
    """The ``.pth`` start-up hook in this interpreter's site-packages, or None when it is not installed."""
    site_dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return next((Path(d) / HOOK_FILE_NAME for d in site_dirs if (Path(d) / HOOK_FILE_NAME).is_file()), None)


def _build(cuda: bool = False) -> None:
    """Compile (or load) the operators; with ``cuda``, CUDA kernels even where no GPU is present."""
    from . import _ext

    if cuda:
        refusal = _ext.toolkit_refusal()
        if refusal:
            raise SystemExit(f"yolo-fastdetect build --cuda: {refusal}")
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", _ext.cuda_arch_list())
    print(f"yolo_fastdetect operators: {_ext.build()}")


def _info() -> None:
    """Print what is installed and what runs; never compiles anything."""
    import torch
    import ultralytics

    from . import __version__, _ext

    print(f"yolo_fastdetect: {__version__} ({Path(__file__).parent})")
    print(f"ultralytics: {ultralytics.__version__}, torch: {torch.__version__} (CUDA {torch.version.cuda}), "
          f"Python: {sys.version.split()[0]}")
    gpus = [f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
            for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    print(f"GPU: {', '.join(gpus) or 'none'}")

    library = _ext.library_path()
    if _ext.is_complete(library):
        loaded = _ext.available()  # loads the cached library; no compilation since its build completed
        kernels = "CPU+CUDA" if loaded and _ext.has_cuda_kernels() else "CPU"
        archs = f" for sm {_ext.cuda_arch_list()}" if kernels == "CPU+CUDA" else ""
        print(f"operators: built ({kernels}{archs}), {'loaded' if loaded else 'NOT loadable'}: {library}")
    else:
        state = "incomplete or damaged, rebuilt" if library.exists() else "not built yet, built"
        print(f"operators: {state} on first use (or now with `yolo-fastdetect build`): {library}")

    print(f"patch: {patch_state()}")
    print(f"on the GPU: {gpu_state()}")
    hook = installed_hook()
    print(f"yolo hook: installed ({hook}); `YOLO_FASTDETECT=1 yolo ...` runs patched" if hook
          else "yolo hook: not installed (install the package with pip to get it)")


def _predict_many(argv: list[str]) -> None:
    """Run ``yolo_fastdetect.ray.cli.main(argv)``; without Ray, say how to install it."""
    if importlib.util.find_spec("ray") is None:  # looked up, not imported: `--help` stays fast
        raise SystemExit("yolo-fastdetect predict-many needs Ray: pip install 'yolo-fastdetect[ray]' "
                         "(or pip install 'ray[data]')")
    from .ray import cli

    cli.main(argv)


def _bench(argv: list[str]) -> None:
    """Run ``yolo_fastdetect.bench.<NAME>.main(argv)``; every benchmark module keeps that contract."""
    from . import bench

    names = sorted(module.name for module in pkgutil.iter_modules(bench.__path__) if not module.name.startswith("_"))
    usage = (f"usage: yolo-fastdetect bench NAME [options]   NAME: {', '.join(names) or '(none yet)'}; "
             "`bench NAME --help` lists its options")
    if argv[:1] and argv[0] in HELP_FLAGS:
        print(usage)
        return
    if not argv or argv[0] not in names:
        raise SystemExit(usage)
    importlib.import_module(f"yolo_fastdetect.bench.{argv[0]}").main(argv[1:])
