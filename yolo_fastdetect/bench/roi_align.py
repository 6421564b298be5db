"""``python -m yolo_fastdetect bench roi_align``: RoIAlign and MultiScaleRoIAlign against torchvision on the GPU.

Times the public functions (argument checks included) with CUDA events: the median of ``--iters`` runs after
``--warmup`` runs, on random non-zero features and random boxes. Prints one markdown table.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from collections.abc import Callable

import torch
import torchvision

from ..ops import MultiScaleRoIAlign, roi_align
from ._timing import single_call_median_ms

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


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench roi_align", description=__doc__)
    parser.add_argument("--rois", type=int, default=1000, help="RoIs per call")
    parser.add_argument("--output-size", type=int, default=7)
    parser.add_argument("--sampling-ratio", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench roi_align needs a CUDA GPU")
    generator = torch.Generator().manual_seed(0)
    device = torch.device("cuda")
    size, ratio = args.output_size, args.sampling_ratio

    def measure(case: str, dtype: torch.dtype, theirs, ours) -> list[str]:
        rows = []
        for direction, their_fn, our_fn in zip(("forward", "backward"), theirs, ours):
            their_ms = single_call_median_ms(their_fn, "cuda", args.iters, args.warmup)
            our_ms = single_call_median_ms(our_fn, "cuda", args.iters, args.warmup)
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
                    lambda f=features, r=rois: torchvision.ops.roi_align(f, r, size, scale, ratio, True), [features]
                )
                ours = forward_and_backward(
                    lambda f=features, r=rois: roi_align(f, r, size, scale, ratio, "avg", True), [features]
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
        theirs = forward_and_backward(lambda: their_module(named, boxes, [(IMAGE_SIZE, IMAGE_SIZE)] * 4), pyramid)
        ours = forward_and_backward(lambda: our_module(pyramid, boxes), pyramid)
        rows += measure("MultiScaleRoIAlign P3-P5 (4, 256)", dtype, theirs, ours)

    print(f"RoIAlign on {torch.cuda.get_device_name(device)}: {args.rois} RoIs, {size}x{size}, sampling {ratio}, "
          f"median of {args.iters} after {args.warmup} warm-up (ms)\n")
    print("| case | pass | dtype | torchvision | yolo_fastdetect | speed-up |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
