"""Command line: ``yolo-fastdetect build | info | bench NAME [options]``."""

from __future__ import annotations

import importlib
import sys


def _build() -> None:
    from . import _ext

    print(f"yolo_fastdetect operators: {_ext.build()}")


def _info() -> None:
    import torch

    from . import __version__, _ext, is_enabled

    print(f"yolo_fastdetect {__version__}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    print(f"GPU: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    print(f"operators loaded: {_ext.available()}, CUDA kernels: {_ext.has_cuda_kernels()}")
    print(f"patch enabled: {is_enabled()}")


def _bench(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: yolo-fastdetect bench NAME [options]  (NAME: a module of yolo_fastdetect.bench)")
    importlib.import_module(f"yolo_fastdetect.bench.{argv[0]}").main(argv[1:])


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``yolo-fastdetect`` and ``python -m yolo_fastdetect``."""
    argv = sys.argv[1:] if argv is None else argv
    command, rest = (argv[0], argv[1:]) if argv else ("info", [])
    if command == "build":
        _build()
    elif command == "info":
        _info()
    elif command == "bench":
        _bench(rest)
    else:
        raise SystemExit(f"unknown command {command!r}; use build, info or bench")
