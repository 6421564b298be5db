"""Helpers shared by the benchmarks: CUDA-event timing, medians after warm-up, rotation over input sets, the seeded
model of the ``model.predict`` benchmarks, the environment line."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch


def median_ms(
    fn: Callable[..., object],
    inputs: Sequence[tuple],
    device: str,
    warmup: int = 10,
    repeats: int = 30,
    calls_per_repeat: int = 20,
) -> float:
    """Median milliseconds per call of ``fn(*inputs[i])``, rotating over ``inputs`` (several sets, so that
    repeated calls do not all hit in the L2 cache).

    On CUDA each repeat is bracketed by events around ``calls_per_repeat`` back-to-back calls, so the number
    includes the launch overhead a user pays in eager mode; on the CPU a wall clock is used.
    """
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for i in range(calls_per_repeat):
                fn(*inputs[i % len(inputs)])
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls_per_repeat)
        else:
            begin = time.perf_counter()
            for i in range(calls_per_repeat):
                fn(*inputs[i % len(inputs)])
            samples.append((time.perf_counter() - begin) * 1e3 / calls_per_repeat)
    return statistics.median(samples)


def single_call_median_ms(fn: Callable[[], object], device: str, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of one call of ``fn()``, each call timed on its own (CUDA events, so a host sync
    inside ``fn`` is included); for work whose result is read on the host, such as NMS."""
    return median_ms(fn, [()], device, warmup=warmup, repeats=repeats, calls_per_repeat=1)


def graph_median_ms(fn: Callable[..., object], inputs: Sequence[tuple], repeats: int = 30) -> float | None:
    """Median GPU milliseconds per call with the launch overhead removed: one call per input set captured
    into a CUDA graph and replayed. None if ``fn`` cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for args in inputs:  # warm-up outside the capture (allocations, lazy initialisation)
                fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for args in inputs:
                fn(*args)
    except Exception:  # noqa: BLE001 - uncapturable code is reported as such, not as a failure
        return None
    graph.replay()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / len(inputs))
    return statistics.median(samples)


def copy_bandwidth_gbs(num_bytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read plus bytes written), the ceiling for memory-bound ops."""
    source = torch.empty(num_bytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
    target = torch.empty_like(source)
    ms = median_ms(lambda: target.copy_(source), [()], "cuda", warmup=3, repeats=10, calls_per_repeat=5)
    return 2 * source.numel() / (ms * 1e-3) / 1e9


def detecting_model(
    config: str,
    device: str | None = None,
    logit_scale: float = 1.0,
    raised: tuple[int, ...] | None = (0, 5),
    seed: int = 0,
    background: float = -6.0,
    calibrated: bool = False,
    raised_bias: float = 1.0,
):
    """The model ``config``, seeded with ``seed``; one built from a YAML gets class biases that make random weights
    detect (in the one-to-one branch too, where there is one): ``raised_bias`` (1) for the classes in ``raised``
    (person and bus by default; None: every class), ``background`` for the others (-6, like a trained model's
    background, which keeps stock NMS fast at conf 0.25; at validation's conf 0.001 every class of every anchor is
    still a candidate, which -9 stops).
    Random weights give nearly the same class logit everywhere, so most scores tie; ``logit_scale`` (e.g. 1e7) scales
    the class convolutions' weights so that scores differ from box to box and stock and patched NMS keep the same
    boxes in the same order. The benchmarks' and the tests' model.
    ``calibrated`` gives the batch norms the statistics of the wheel's images (:func:`calibrate_batch_norms`): random
    weights with default statistics shrink the features to nearly nothing by the head, which half precision cannot
    resolve; calibrated, every layer's features have a trained model's scale and half precision rounds them as it
    rounds a trained model's.

    Examples:
        >>> model = detecting_model("yolo11n.yaml", "cpu", logit_scale=1e7)
    """
    from ultralytics import YOLO

    torch.manual_seed(seed)
    model = YOLO(config)
    if config.endswith((".yaml", ".yml")):
        head = model.model.model[-1]
        # A one-to-one (NMS-free) branch gets the same biases: YOLO26 predicts through it by default before 8.4.142.
        for branch in [*head.cv3, *getattr(head, "one2one_cv3", [])]:
            bias = torch.full_like(branch[-1].bias, background)
            bias[[c for c in raised if c < len(bias)] if raised is not None else slice(None)] = raised_bias
            branch[-1].bias.data.copy_(bias)
            branch[-1].weight.data.mul_(logit_scale)
        if calibrated:
            calibrate_batch_norms(model.model)
    return model.to(device) if device is not None else model


def calibrate_batch_norms(net: torch.nn.Module, imgsz: int = 640) -> None:
    """Set every batch norm's running statistics to those of one training-mode forward pass over the wheel's two
    images (each resized to ``imgsz`` square, and mirrored), so that each layer's output has unit scale; ``net`` is
    left in eval mode."""
    import cv2

    from ._tiny_dataset import asset_images

    images = []
    for path in asset_images():
        image = cv2.resize(cv2.imread(path), (imgsz, imgsz))[:, :, ::-1]
        images += [image, image[:, ::-1]]
    batch = torch.from_numpy(np.ascontiguousarray(np.stack(images))).permute(0, 3, 1, 2).float() / 255
    norms = [module for module in net.modules() if isinstance(module, torch.nn.BatchNorm2d)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: after one pass, the pass's statistics
    net.train()
    with torch.no_grad():
        net(batch)
    net.eval()


def _commit() -> str:
    """The checkout's short commit, or "unknown" (a tree copied without .git, or no git)."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def environment_line() -> str:
    """GPU (or CPU), torch version and date, for the header of a benchmark's table."""
    import datetime
    import platform

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.processor() or 'x86_64'})"
    threads = torch.get_num_threads()
    line = f"{datetime.date.today()} | {device} | torch {torch.__version__} | {threads} CPU threads"
    return f"{line} | commit {_commit()}"


def append_records(path: Path, records: list[dict]) -> None:
    """Append ``records`` to the JSON list in ``path`` (a ``benchmarks/records/`` file; made, with its folder, if
    absent), and say so."""
    existing = json.loads(path.read_text()) if path.exists() else []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(existing + records, indent=1) + "\n")
    print(f"records appended to {path}")


def record_header(benchmark: str, table: str) -> dict:
    """The fields of a ``benchmarks/records/`` record that say which run it is: benchmark and table, date, machine,
    versions and commit (the caller adds ``config`` and ``figures``).

    Examples:
        >>> record_header("val", "cpu")["benchmark"]
        'val'
    """
    import datetime
    import os
    import platform

    import ultralytics

    return {
        "benchmark": benchmark,
        "table": table,
        "date": str(datetime.date.today()),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "host": f"{os.cpu_count()} CPU cores",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "ultralytics": ultralytics.__version__,
        "python": ".".join(platform.python_version_tuple()[:2]),
        "commit": _commit(),
    }
