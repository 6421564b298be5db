"""``python -m yolo_fastdetect bench roi_align``: RoIAlign and MultiScaleRoIAlign against torchvision on the GPU.

Times the public functions (argument checks included) with CUDA events: the median of ``--iters`` runs after
``--warmup`` runs, on random non-zero features and random boxes. Prints one markdown table.

``--profile`` instead says where each call of those cases spends its time, ours and torchvision's, without and with
``requires_grad``: host ms per call (calls queued without syncing), host ms of one call on an idle GPU (until it
returns), the benchmark's single-call median, the GPU time alone (one call replayed from a CUDA graph; without
grad), and the kernels of the forward and of the backward call (torch.profiler, us per call). ``--profile ncu``
runs one forward and backward per dtype of the (4, 256, 80, 80) NCHW case and nothing else, for a kernel profiler::

    ncu --clock-control none --cache-control none python -m yolo_fastdetect bench roi_align --profile ncu

``--device cpu`` runs the table or ``--profile`` on the CPU (wall clock; no graph replay), e.g. as a smoke run.
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from collections.abc import Callable

import torch
import torchvision

from ..ops import MultiScaleRoIAlign, roi_align
from ._timing import graph_median_ms, single_call_median_ms

IMAGE_SIZE = 640
LEVEL_SHAPES = {"(4, 256, 80, 80)": (4, 256, 80, 80), "(4, 64, 160, 160)": (4, 64, 160, 160)}


def random_boxes(generator: torch.Generator, count: int, batch: int) -> torch.Tensor:
    """(count, 5) rois on a 640x640 input, 16 to 320 pixels a side (log-uniform), spread over the batch."""
    size = torch.exp(torch.empty(count, 2).uniform_(2.77, 5.77, generator=generator))
    corner = torch.rand(count, 2, generator=generator) * (IMAGE_SIZE - size)
    batch_index = torch.randint(0, batch, (count, 1), generator=generator).float()
    return torch.cat((batch_index, corner, corner + size), 1)


def forward_and_backward(pool: Callable[[], torch.Tensor], inputs: list[torch.Tensor]):
    """Closures timing ``pool()`` alone and the backward pass of its output to ``inputs``."""
    output = pool()
    grad = torch.randn_like(output)
    return pool, lambda: torch.autograd.grad(output, inputs, grad, retain_graph=True)


def _host_times(fn: Callable[[], object], device: str) -> tuple[float, float]:
    """Host ms per call of ``fn`` queued 50 times without a sync, and the median host ms of one call (30 calls, each
    on an idle device, until it returns)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(5):
        fn()
    sync()
    begin = time.perf_counter()
    for _ in range(50):
        fn()
    queued = (time.perf_counter() - begin) / 50 * 1e3
    sync()
    latencies = []
    for _ in range(30):
        begin = time.perf_counter()
        fn()
        latencies.append((time.perf_counter() - begin) * 1e3)
        sync()
    return queued, sorted(latencies)[len(latencies) // 2]


def _kernel_times(fn: Callable[[], object], device: str, calls: int = 10) -> str:
    """The kernels of ``fn`` (us per call, torch.profiler); on the CPU the six operators with the most self time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    events = prof.key_averages()
    if device == "cuda":
        times = [(e.key, e.device_time_total) for e in events
                 if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    else:
        times = sorted(((e.key, e.self_cpu_time_total) for e in events), key=lambda kv: -kv[1])[:6]
    return ", ".join(f"{key[:60]} {total / calls:.1f}" for key, total in times) or "-"


def profile_case(case: str, dtype: torch.dtype, theirs, ours, args) -> list[str]:
    """``--profile``: print where the calls of one case spend their time (see the module docstring)."""
    dtype_name = str(dtype).removeprefix("torch.")
    for side, (forward, backward) in (("torchvision", theirs), ("yolo_fastdetect", ours)):
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                queued, latency = _host_times(forward, args.device)
                single = single_call_median_ms(forward, args.device, args.iters, args.warmup)
                gpu = graph_median_ms(lambda f=forward: f(), [()]) if args.device == "cuda" and not grad else None
            gpu_text = f"{gpu:.3f}" if gpu is not None else "-"
            print(f"{dtype_name} {case} {side} forward grad={grad}: host {queued:.3f}  latency {latency:.3f}  "
                  f"single-call {single:.3f}  gpu(graph) {gpu_text} ms", flush=True)
        what = "kernels of {} (us per call)" if args.device == "cuda" else "operators of {} (self CPU us per call)"
        print(f"  {what.format('forward')}: {_kernel_times(forward, args.device)}")
        print(f"  {what.format('backward')}: {_kernel_times(backward, args.device)}", flush=True)
    return []


def kernel_profiler_calls(args) -> None:
    """``--profile ncu``: one forward and one backward call per dtype of the (4, 256, 80, 80) NCHW case."""
    generator = torch.Generator().manual_seed(0)
    shape = LEVEL_SHAPES["(4, 256, 80, 80)"]
    for dtype in (torch.float32, torch.float16):
        features = torch.randn(shape, generator=generator).to(args.device).to(dtype).requires_grad_(True)
        rois = random_boxes(generator, args.rois, shape[0]).to(args.device).to(dtype)
        output = roi_align(features, rois, args.output_size, shape[2] / IMAGE_SIZE, args.sampling_ratio, "avg", True)
        output.backward(torch.randn_like(output))
    if args.device == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench roi_align", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rois", type=int, default=1000, help="RoIs per call")
    parser.add_argument("--output-size", type=int, default=7)
    parser.add_argument("--sampling-ratio", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument(
        "--profile", nargs="?", const="times", choices=("times", "ncu"),
        help="times (the default with --profile): where each call's time goes, host and kernels; ncu: one forward "
        "and backward per dtype of the (4, 256, 80, 80) case only, to run under a kernel profiler",
    )
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: wall clock, no graphs")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench roi_align needs a CUDA GPU (or --device cpu)")
    if args.profile == "ncu":
        return kernel_profiler_calls(args)
    generator = torch.Generator().manual_seed(0)
    device = torch.device(args.device)
    size, ratio = args.output_size, args.sampling_ratio

    def measure(case: str, dtype: torch.dtype, theirs, ours) -> list[str]:
        if args.profile:
            return profile_case(case, dtype, theirs, ours, args)
        rows = []
        for direction, their_fn, our_fn in zip(("forward", "backward"), theirs, ours):
            their_ms = single_call_median_ms(their_fn, args.device, args.iters, args.warmup)
            our_ms = single_call_median_ms(our_fn, args.device, args.iters, args.warmup)
            rows.append(
                f"| {case} | {direction} | {str(dtype).removeprefix('torch.')} | {their_ms:.3f} | {our_ms:.3f} "
                f"| {their_ms / our_ms:.2f}x |"
            )
        return rows

    rows = []
    for dtype in (torch.float32, torch.float16):
        for name, shape in LEVEL_SHAPES.items():
            scale = shape[2] / IMAGE_SIZE
            rois = random_boxes(generator, args.rois, shape[0]).to(device=device, dtype=dtype)
            for layout in (torch.contiguous_format, torch.channels_last):
                features = torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
                features = features.contiguous(memory_format=layout).requires_grad_(True)
                theirs = forward_and_backward(
                    lambda f=features, r=rois, s=scale: torchvision.ops.roi_align(f, r, size, s, ratio, True),
                    [features],
                )
                ours = forward_and_backward(
                    lambda f=features, r=rois, s=scale: roi_align(f, r, size, s, ratio, "avg", True), [features]
                )
                case = f"roi_align {name}{' channels_last' if layout is torch.channels_last else ''}"
                rows += measure(case, dtype, theirs, ours)

        # P3/P4/P5 of a 640x640 input, 256 channels each, torchvision's conventions (aligned=False).
        pyramid = [
            torch.randn((4, 256, IMAGE_SIZE // s, IMAGE_SIZE // s), generator=generator)
            .to(device=device, dtype=dtype)
            .requires_grad_(True)
            for s in (8, 16, 32)
        ]
        rois = random_boxes(generator, args.rois, 4).to(device=device, dtype=dtype)
        boxes = [rois[rois[:, 0] == i, 1:] for i in range(4)]
        their_module = torchvision.ops.MultiScaleRoIAlign(["p3", "p4", "p5"], size, ratio)
        named = OrderedDict(zip(["p3", "p4", "p5"], pyramid))
        our_module = MultiScaleRoIAlign(size, (8, 16, 32), ratio, aligned=False)
        theirs = forward_and_backward(
            lambda m=their_module, n=named, b=boxes: m(n, b, [(IMAGE_SIZE, IMAGE_SIZE)] * 4), pyramid
        )
        ours = forward_and_backward(lambda m=our_module, p=pyramid, b=boxes: m(p, b), pyramid)
        rows += measure("MultiScaleRoIAlign P3-P5 (4, 256)", dtype, theirs, ours)

    if args.profile:
        return
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU (wall clock)"
    print(f"RoIAlign on {name}: {args.rois} RoIs, {size}x{size}, sampling {ratio}, "
          f"median of {args.iters} after {args.warmup} warm-up (ms)\n")
    print("| case | pass | dtype | torchvision | yolo_fastdetect | speed-up |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
