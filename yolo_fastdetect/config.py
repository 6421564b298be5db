"""Every ``YOLO_FASTDETECT*`` environment variable, declared once: its name, type, default and meaning.

The code reads each one through :func:`get` where and when it needs it (``YOLO_FASTDETECT`` as the package is
imported, the build settings when the operators are built, the others at each call or as a loader is made), so a
change to the environment applies from the next read on. Every value is parsed the same way: unset or empty is the
default; a switch is ``0`` or ``1``; an integer is decimal digits, at least the variable's minimum; a path or text is
taken as written. Anything else raises :class:`ConfigError` naming the variable and the value.

One reader stays outside: the start-up hook ``patches/yolo_fastdetect_hook.pth`` must not import the package, so it
checks ``YOLO_FASTDETECT == "1"`` itself (its entry below says what it does).

``python -m yolo_fastdetect.config --markdown`` prints the table of README's Configuration section, which a test
keeps equal to :func:`markdown_table`.

Examples:
    >>> from yolo_fastdetect import config
    >>> config.get("YOLO_FASTDETECT_READ_AHEAD")  # unset: the default
    2
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["VARIABLES", "ConfigError", "Variable", "get", "markdown_table"]

SWITCH, INTEGER, PATH, TEXT = "switch", "integer", "path", "text"


class ConfigError(ValueError):
    """A ``YOLO_FASTDETECT*`` environment variable holds a value its type does not allow."""


@dataclass(frozen=True)
class Variable:
    """One environment variable.

    Args:
        name (str): The variable's name.
        type (str): ``switch`` (``0`` or ``1``), ``integer``, ``path`` or ``text``.
        default (object): The value when unset or empty, or a function computing it at the read.
        default_text (str): The default as the table shows it.
        meaning (str): What it does, one line.
        minimum (int | None): The least value of an integer.
        audience (str): ``""`` for users; ``tests`` or ``benchmarks`` for one that only those read.
    """

    name: str
    type: str
    default: object
    default_text: str
    meaning: str
    minimum: int | None = None
    audience: str = ""

    def parse(self, value: str | None) -> object:
        """The value of ``value`` (the variable's text, None when unset); raises :class:`ConfigError`."""
        if value is None or value == "":
            return self.default() if callable(self.default) else self.default
        if self.type == SWITCH:
            if value not in ("0", "1"):
                raise ConfigError(f"{self.name}={value!r} is not 0 or 1")
            return value == "1"
        if self.type == INTEGER:
            kind = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(
                self.minimum, f"an integer of at least {self.minimum}")
            if not re.fullmatch(r"[+-]?[0-9]+", value.strip()):
                raise ConfigError(f"{self.name}={value!r} is not {kind}")
            number = int(value)
            if self.minimum is not None and number < self.minimum:
                raise ConfigError(f"{self.name}={value!r} is not {kind}")
            return number
        if self.type == PATH:
            return Path(value)
        return value


def _decoder_threads() -> int:
    """The cores this process may run on, less one (the predictor's thread), at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


def _cache_folder() -> Path:
    return Path.home() / ".cache" / "yolo_fastdetect"


# The compiler flags' reasons are in yolo_fastdetect._ext.cpu_flags.
DEFAULT_CXXFLAGS = "-O3 -march=native -fno-trapping-math -ffp-contract=off -fopenmp"

_DECLARED = [
    Variable("YOLO_FASTDETECT", SWITCH, True, "1",
             "`0`: `import yolo_fastdetect` leaves Ultralytics stock; `1`: the plain `yolo` command also runs patched "
             "(the start-up hook)"),
    Variable("YOLO_FASTDETECT_CACHE", PATH, _cache_folder, "`~/.cache/yolo_fastdetect`",
             "folder of the compiled operators"),
    Variable("YOLO_FASTDETECT_CPU_ONLY", SWITCH, False, "0",
             "`1`: build the operators without CUDA kernels, even where a GPU and a toolkit are present"),
    Variable("YOLO_FASTDETECT_CXXFLAGS", TEXT, DEFAULT_CXXFLAGS, f"`{DEFAULT_CXXFLAGS}`",
             "compiler flags of the C++ sources (say, without `-march=native` for a cluster of mixed CPUs)"),
    Variable("YOLO_FASTDETECT_GRAPHS", SWITCH, True, "1",
             "`0`: no CUDA graph replay, of the forward or of the post-processing (read at each call)"),
    Variable("YOLO_FASTDETECT_GRAPH_CACHE", INTEGER, 8, "8",
             "most CUDA graphs each cache keeps, least recently used dropped first; 0 captures none (read at each "
             "call)", minimum=0),
    Variable("YOLO_FASTDETECT_SOURCES", SWITCH, True, "1",
             "`0`: Ultralytics' own loaders for every source and for `model.val` (read as a loader is made, as are "
             "the nine below)"),
    Variable("YOLO_FASTDETECT_DECODE_THREADS", INTEGER, _decoder_threads, "CPU cores - 1",
             "decoder threads of a file source (and of `model.val`'s set, by default at most 8)", minimum=1),
    Variable("YOLO_FASTDETECT_READ_AHEAD", INTEGER, 2, "2",
             "batches decoded ahead of the predictor (of `model.val`'s loop: 4)", minimum=1),
    Variable("YOLO_FASTDETECT_LIST_OPENCV", SWITCH, True, "1",
             "`0`: every file of a list decodes through Pillow, as stock (by default OpenCV decodes the JPEGs)"),
    Variable("YOLO_FASTDETECT_UPLOAD_AHEAD", SWITCH, True, "1",
             "`0`: at batch 1, and for a list of several videos, the predictor's thread uploads each image to the GPU, "
             "not the decoder threads"),
    Variable("YOLO_FASTDETECT_GPU_JPEG", SWITCH, False, "0",
             "`1` (opt-in, not stock's pixels): a folder's, glob's or list's baseline JPEGs decode on the GPU "
             "(nvJPEG)"),
    Variable("YOLO_FASTDETECT_GPU_VIDEO", SWITCH, False, "0",
             "`1`: H.264 and HEVC videos decode on the GPU (NVDEC, the `[video]` extra) where that gives cv2's "
             "frames; one log line says why where it does not"),
    Variable("YOLO_FASTDETECT_PYAV_VIDEO", SWITCH, True, "1",
             "`0`: a GPU predictor's videos decode with cv2, as stock's; by default its H.264 and HEVC videos decode "
             "with PyAV (the `[video]` extra) to planes that the GPU converts to cv2's BGR bytes"),
    Variable("YOLO_FASTDETECT_NVDEC_DECODERS", INTEGER, 1, "1",
             "with `YOLO_FASTDETECT_GPU_VIDEO=1`: NVDEC decoders shared by the videos open at once; a video given "
             "several decodes its closed GOPs on them at once", minimum=1),
    Variable("YOLO_FASTDETECT_DECODER_NICE", SWITCH, True, "1",
             "`0`: the decoder threads of a GPU predictor keep its priority (by default nice +5, Linux)"),
    Variable("YOLO_FASTDETECT_BENCH_SCALE_TIMES", PATH, None, "unset",
             "folder where `bench scale`'s actors note each batch's end (the benchmark sets it for them)",
             audience="benchmarks"),
    Variable("YOLO_FASTDETECT_TEST_SEED", INTEGER, None, "random",
             "seed of the tests' random inputs, to replay a failure (each test prints its seed)", audience="tests"),
    Variable("YOLO_FASTDETECT_TEST_TOOLKITS", TEXT, "", "unset",
             "`cu13=FOLDER:cu12=FOLDER`: CUDA toolkit wheels for `tests/test_toolkit.py` (set by `.ci/run`)",
             audience="tests"),
    Variable("YOLO_FASTDETECT_ULTRALYTICS_SITES", TEXT, "", "unset",
             "folders of older Ultralytics releases, separated as in `PYTHONPATH`, for `tests/test_versions.py`",
             audience="tests"),
]

VARIABLES: dict[str, Variable] = {variable.name: variable for variable in _DECLARED}


def get(name: str) -> object:
    """The value of the declared variable ``name`` in the environment now; raises :class:`ConfigError` for a value
    its type does not allow, and KeyError for a name not declared here."""
    return VARIABLES[name].parse(os.environ.get(name))


def is_set(name: str) -> bool:
    """Whether the declared variable ``name`` holds a value now (unset or empty reads as its default); KeyError for a
    name not declared here."""
    return bool(os.environ.get(VARIABLES[name].name))


def markdown_table() -> str:
    """README's configuration table: one row per variable a user sets (those only tests and benchmarks read are
    documented here, in the module)."""
    rows = ["| Variable | Type | Default | Meaning |", "| --- | --- | --- | --- |"]
    for variable in _DECLARED:
        if not variable.audience:
            rows.append(f"| `{variable.name}` | {variable.type} | {variable.default_text} | {variable.meaning} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m yolo_fastdetect.config", description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print README's configuration table")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_table())
    else:
        for name in VARIABLES:  # the values now, as the code would read them
            state = "set" if is_set(name) else "default"
            print(f"{name} = {get(name)!r} ({state})")


if __name__ == "__main__":
    main()
