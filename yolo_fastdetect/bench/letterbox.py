"""``python -m yolo_fastdetect bench letterbox``: preprocessing, stock Ultralytics vs the letterbox operator.

Stock is what the predictor does: ``LetterBox`` (cv2) on each image on the CPU, stack, upload the uint8 batch,
then BGR->RGB, CHW, dtype and /255 on the device (``BasePredictor.preprocess``). Ours packs the original images
into pinned memory (a few threads), uploads each piece without blocking as soon as it is filled, and runs one
kernel for the whole batch (:func:`yolo_fastdetect.letterbox`). The images are the wheel's bus.jpg and zidane.jpg,
alternating, so a batch holds two sizes (the predictor then letterboxes to the full square, ``auto=False``).
Median milliseconds per batch (CUDA events around each call, so host work is included; a wall clock on the CPU).
Prints one markdown table, with whether both inputs are bit-identical.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import cv2
import torch

from ..ops import letterbox
from ._timing import environment_line, single_call_median_ms


def stock_preprocess(images: list, image_size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Stock ``BasePredictor.pre_transform`` + ``preprocess`` for a PyTorch model with stride 32, ``rect`` off."""
    from ultralytics.engine.predictor import BasePredictor

    predictor = SimpleNamespace(
        imgsz=[image_size, image_size],
        args=SimpleNamespace(rect=False),
        scale_fill=False,
        model=SimpleNamespace(format="pt", stride=32, fp16=dtype == torch.float16),
        device=device,
    )
    predictor.pre_transform = lambda batch: BasePredictor.pre_transform(predictor, batch)
    return BasePredictor.preprocess(predictor, images)


def main(argv: list[str]) -> None:
    from ultralytics.utils import ASSETS

    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench letterbox", description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--dtypes", nargs="+", default=["float16", "float32"], choices=["float16", "float32"])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assets = [cv2.imread(str(ASSETS / name)) for name in ("bus.jpg", "zidane.jpg")]

    rows = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for batch in args.batches:
            images = [assets[i % 2] for i in range(batch)]

            def stock(images=images, dtype=dtype):
                return stock_preprocess(images, args.imgsz, dtype, device)

            def ours(images=images, dtype=dtype):
                return letterbox(images, args.imgsz, dtype=dtype, device=device)[0]

            identical = torch.equal(stock(), ours())
            stock_ms = single_call_median_ms(stock, device.type, args.repeats, args.warmup)
            our_ms = single_call_median_ms(ours, device.type, args.repeats, args.warmup)
            rows.append(
                f"| {batch} | {dtype_name} | {stock_ms:.2f} | {our_ms:.2f} | {stock_ms / batch:.3f} | "
                f"{our_ms / batch:.3f} | {stock_ms / our_ms:.1f}x | {'yes' if identical else 'NO'} |"
            )

    print(f"{environment_line()}\n")
    print(f"Letterbox preprocessing to {args.imgsz}x{args.imgsz} on {device.type}: bus.jpg / zidane.jpg alternating, "
          f"median of {args.repeats} batches after {args.warmup} warm-up (ms)\n")
    print("| batch | dtype | stock ms | ours ms | stock ms/img | ours ms/img | speed-up | bit-identical |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
