"""``python -m yolo_fastdetect bench e2e``: ``model.predict`` end to end, stock Ultralytics against yolo_fastdetect.

Both run in one process on the same model object, toggled with ``yolo_fastdetect.disable()`` / ``enable()``: the
wheel's bus.jpg (1080x810) and zidane.jpg (720x1280), decoded once with cv2, alternate inside a batch (so batches
of several images mix sizes and are letterboxed to 640x640) and, at batch 1, from one call to the next (two
rectangular input shapes, each captured in its own CUDA graph). Models are built from their YAML with seeded
weights and the person/bus class biases raised so that they detect; fp16 (``half=True``) on CUDA.

Per model and batch: ``--warmup`` calls (enough for the graphs to be captured), then ``--iters`` timed calls, each
bracketed by CUDA events. Reported: the median wall time per image and images/s, the median of Ultralytics' own
per-image stage times (``Results.speed``), the speed-up, and whether stock and ours detect the same on the last
timed call (boxes per side, largest distance from one of our boxes to stock's nearest box of its class).
The warm-up calls' wall time is reported too (seconds, both sides).

``--compile MODE [MODE ...]`` adds, per model and batch, a row per mode (``default``, ``reduce-overhead``,
``max-autotune-no-cudagraphs``, ...) with stock and ours each predicting through Ultralytics' ``compile=MODE``
(``torch.compile`` of the ``AutoBackend`` model, inductor). Each side starts from a new predictor and an empty dynamo
cache, so its warm-up includes all of its own compilation (every row's sides start from a new predictor, as a user's
first call makes). A process's first use of an input shape and layout pays set-up costs (seconds, for yolo12n)
that stock's side, which runs first, pays for both: ours' warm-up leaves them out, unless its layout differs.
Inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``) shortens a repeated run's warm-up: point it at an empty folder
for the first run's numbers.

``--channels-last`` adds a row per model and batch with Ultralytics' own ``channels_last=True`` (the ``AutoBackend``
model's weights in NHWC; Ultralytics turns it on by itself only for x86 CPUs), stock and ours.

Options: ``--models``, ``--batches``, ``--iters``, ``--warmup``, ``--compile``, ``--channels-last``, ``--json PATH``
(raw numbers, for
``benchmarks/plot_e2e.py``), ``--device cpu`` (a smoke run with a wall clock; the patch changes nothing there),
``--profile`` (instead of the table, where the host time of a patched call goes: cProfile over ``--iters`` calls of
the first model at the first batch size after ``--warmup`` calls, the 40 costliest functions by cumulative time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from ._timing import detecting_model, environment_line

STAGES = ("preprocess", "inference", "postprocess")


def load_images() -> list[np.ndarray]:
    """bus.jpg and zidane.jpg from the Ultralytics wheel, BGR as the predictor's loader reads them."""
    from ultralytics.utils import ASSETS

    return [cv2.imread(str(ASSETS / name)) for name in ("bus.jpg", "zidane.jpg")]


def batch_images(images: list[np.ndarray], batch: int, call: int) -> list[np.ndarray]:
    """The images of one call: alternating within the batch, and between calls (so batch 1 sees both sizes)."""
    return [images[(call + i) % len(images)] for i in range(batch)]


def time_predict(model, images: list[np.ndarray], batch: int, device: str, warmup: int, iters: int,
                 compile_mode: bool | str = False, channels_last: bool | None = None) -> dict:
    """Time ``model.predict`` as it is currently patched (or not), with Ultralytics' ``compile=compile_mode`` and
    ``channels_last`` (None: Ultralytics' own choice); the numbers and the last call's results."""
    cuda = device == "cuda"
    options = {"device": device, "batch": batch, "verbose": False, "quantize": 16 if cuda else None,  # half=True
               "compile": compile_mode, "channels_last": channels_last}
    begin = time.perf_counter()
    for call in range(warmup):
        model.predict(batch_images(images, batch, call), **options)
    if cuda:
        torch.cuda.synchronize()
    warmup_s = time.perf_counter() - begin
    wall, speeds = [], []
    for call in range(iters):
        sources = batch_images(images, batch, call)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            results = model.predict(sources, **options)
            end.record()
            end.synchronize()
            wall.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            results = model.predict(sources, **options)
            wall.append((time.perf_counter() - begin) * 1e3)
        speeds.append(results[0].speed)
    ms = statistics.median(wall)
    return {
        "ms_per_image": ms / batch,
        "images_per_s": batch * 1e3 / ms,
        "stages_ms_per_image": {stage: statistics.median(s[stage] for s in speeds) for stage in STAGES},
        "warmup_s": warmup_s,
        "results": results,
    }


def detection_difference(ours: list, stock: list, conf_atol: float = float("inf")) -> dict:
    """Compare two lists of ``Results``: boxes on each side, whether every image has as many of ours as stock's, and
    the largest distance (max over x1, y1, x2, y2, original pixels) from one of our boxes to the nearest stock box
    of its class whose confidence is within ``conf_atol`` (infinite where there is none). Nearest rather than in
    order: in fp16 confidences tie, and two NMS implementations may list tied boxes differently.

    ``max_box_diff_px_untied`` is the same distance over the boxes whose score no other box of their image shares,
    on either side: where many scores tie (seeded weights), which of the tied boxes NMS keeps is arbitrary on both
    sides, so only the untied boxes say whether the two agree; ``tied`` counts the boxes left out of it."""
    distance, untied_distance, tied = 0.0, 0.0, 0
    for mine, theirs in zip(ours, stock):
        mine, theirs = mine.boxes.data.float().cpu(), theirs.boxes.data.float().cpu()
        if not len(mine) or not len(theirs):
            distance = untied_distance = distance if len(mine) == len(theirs) else float("inf")
            continue
        gaps = (mine[:, None, :4] - theirs[None, :, :4]).abs().amax(2)
        same_class = mine[:, None, 5] == theirs[None, :, 5]
        partners = same_class & ((mine[:, None, 4] - theirs[None, :, 4]).abs() <= conf_atol)
        nearest = gaps.masked_fill(~partners, float("inf")).amin(1)
        distance = max(distance, nearest.max().item())
        mine_untied, theirs_untied = (_untied(side[:, 4]) for side in (mine, theirs))
        tied += int((~mine_untied).sum())
        if mine_untied.any():
            untied_partners = partners & theirs_untied[None, :]
            untied_nearest = gaps.masked_fill(~untied_partners, float("inf")).amin(1)[mine_untied]
            untied_distance = max(untied_distance, untied_nearest.max().item())
    return {
        "stock": sum(len(r.boxes) for r in stock),
        "ours": sum(len(r.boxes) for r in ours),
        "same_counts": len(ours) == len(stock) and all(len(a.boxes) == len(b.boxes) for a, b in zip(ours, stock)),
        "max_box_diff_px": distance,
        "max_box_diff_px_untied": untied_distance,
        "tied": tied,
    }


def _untied(scores: torch.Tensor) -> torch.Tensor:
    """Which of an image's scores no other of its boxes shares."""
    return (scores[:, None] == scores[None, :]).sum(1) == 1


def bench_model(name: str, images: list[np.ndarray], batches: list[int], device: str, warmup: int,
                iters: int, compile_modes: list[bool | str] = (), channels_last: bool = False) -> list[dict]:
    """Stock and ours for one model at each batch size: eager, then with each of ``compile_modes``, then with
    ``channels_last=True`` where asked."""
    import yolo_fastdetect

    model = detecting_model(name)
    settings = [(False, None), *((mode, None) for mode in compile_modes), *([(False, True)] if channels_last else [])]
    rows = []
    for batch in batches:
        for compile_mode, layout in settings:
            row = {"model": name, "batch": batch, "compile": compile_mode, "channels_last": bool(layout)}
            for side, switch in (("stock", yolo_fastdetect.disable), ("ours", yolo_fastdetect.enable)):
                switch()
                model.predictor = None  # a new one, as a user's first call makes (its setup_model picks the layout)
                if compile_mode:  # compiled afresh: nothing of the other side reused
                    torch._dynamo.reset()
                row[side] = time_predict(model, images, batch, device, warmup, iters, compile_mode, layout)
            row["speedup"] = row["stock"]["ms_per_image"] / row["ours"]["ms_per_image"]
            row["detections"] = detection_difference(row["ours"].pop("results"), row["stock"].pop("results"))
            rows.append(row)
            print(f"  {name} batch {batch} {setting(row)}: stock {row['stock']['ms_per_image']:.3f}, ours "
                  f"{row['ours']['ms_per_image']:.3f} ms/image; warm-up stock {row['stock']['warmup_s']:.1f} s, "
                  f"ours {row['ours']['warmup_s']:.1f} s", flush=True)
            # The row's whole table line too: a run cut short by a time limit keeps every finished row.
            print("  " + markdown_table([row]).splitlines()[-1], flush=True)
    return rows


def profile_predict(name: str, images: list[np.ndarray], batch: int, device: str, warmup: int, iters: int) -> None:
    """``--profile``: cProfile of ``iters`` patched ``model.predict`` calls (host time, by function)."""
    import cProfile
    import pstats

    import yolo_fastdetect

    yolo_fastdetect.enable()
    model = detecting_model(name)
    options = {"device": device, "batch": batch, "verbose": False, "quantize": 16 if device == "cuda" else None}
    for call in range(warmup):
        model.predict(batch_images(images, batch, call), **options)
    if device == "cuda":
        torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for call in range(iters):
        results = model.predict(batch_images(images, batch, call), **options)
    profiler.disable()
    print(f"\ncProfile of {iters} patched model.predict calls, {name}, batch {batch}; speed of the last call: "
          f"{results[0].speed}")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)


def setting(row: dict) -> str:
    """A row's setting as the table shows it: ``-`` (eager), the compile mode, or ``channels_last``."""
    return "channels_last" if row.get("channels_last") else str(row["compile"] or "-")


def parse_compile_mode(text: str) -> bool | str:
    """``--compile``'s value as Ultralytics' ``compile=`` takes it: ``true`` is True (torch.compile's default mode),
    anything else a torch.compile mode name."""
    return True if text.lower() in ("true", "1") else text


def markdown_table(rows: list[dict]) -> str:
    header = (
        "| model | batch | setting | stock ms/img | ours ms/img | speed-up | stock img/s | ours img/s | "
        "stock pre / inf / post | ours pre / inf / post | warm-up s stock / ours | boxes stock / ours | "
        "max box diff (px), untied scores (tied boxes) |\n"
        "|---|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|"
    )
    lines = [header]
    for row in rows:
        stock, ours, detections = row["stock"], row["ours"], row["detections"]

        def stages(side: dict) -> str:
            return " / ".join(f"{side['stages_ms_per_image'][stage]:.3f}" for stage in STAGES)

        lines.append(
            f"| {row['model']} | {row['batch']} | {setting(row)} | {stock['ms_per_image']:.3f} | "
            f"{ours['ms_per_image']:.3f} | {row['speedup']:.2f}x | {stock['images_per_s']:.0f} | "
            f"{ours['images_per_s']:.0f} | {stages(stock)} | {stages(ours)} | "
            f"{stock['warmup_s']:.1f} / {ours['warmup_s']:.1f} | {detections['stock']} / {detections['ours']} | "
            f"{detections['max_box_diff_px_untied']:.2g} ({detections['tied']}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; ``argv`` are the options after ``bench e2e``."""
    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["yolo12n.yaml", "yolov8s.yaml"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--iters", type=int, default=20, help="timed calls per row (default 20)")
    parser.add_argument("--warmup", type=int, default=6, help="untimed calls first; >= 4 captures both batch-1 shapes")
    parser.add_argument("--compile", nargs="+", default=[], type=parse_compile_mode, metavar="MODE",
                        help="also rows with Ultralytics' compile=MODE (true/default, reduce-overhead, "
                             "max-autotune-no-cudagraphs, ...), stock and ours")
    parser.add_argument("--channels-last", action="store_true",
                        help="also rows with Ultralytics' channels_last=True (NHWC weights), stock and ours")
    parser.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke run only")
    parser.add_argument("--profile", action="store_true",
                        help="instead: cProfile the patched calls of the first model at the first batch size")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench e2e needs a CUDA GPU (or --device cpu for a smoke run)")
    from .. import _ext

    _ext.require()
    images = load_images()
    if args.profile:
        return profile_predict(args.models[0], images, args.batches[0], args.device, args.warmup, args.iters)
    environment = environment_line()
    print(f"model.predict end to end: {environment}", flush=True)
    rows = [row for name in args.models for row in bench_model(name, images, args.batches, args.device,
                                                              args.warmup, args.iters, args.compile,
                                                              args.channels_last)]
    precision, clock = ("fp16", "CUDA events") if args.device == "cuda" else ("fp32", "wall clock")
    print(f"\nmodel.predict on bus.jpg/zidane.jpg (numpy, alternating), {precision}, {args.device}: median of "
          f"{args.iters} calls after {args.warmup} warm-up; ms per image (wall: {clock} around each call; "
          "stages: Ultralytics' Results.speed)\n")
    print(markdown_table(rows))
    if args.json:
        settings = {key: value for key, value in vars(args).items() if key not in ("json", "profile")}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": environment, "settings": settings, "rows": rows},
                                        indent=2))
        print(f"\nraw numbers: {args.json}")
