"""``python -m yolo_fastdetect bench parity``: stock's detections against ours in the modes users run.

Sixteen images made from the wheel's two (random scales 0.5-1.2, every third mirrored, a seed), predicted by a seeded
YAML model (class biases raised so that it detects) at batch 1 and 16, in fp32 with torch's default flags (cuDNN's
TF32 on), fp32 with TF32 off and fp16, at conf 0.25 and 0.001: stock (the package disabled) twice, then ours, in one
process on one model. Per row: how many images differ from stock (any box, score or class, bit for bit), on how many
the number of boxes differs, and the largest box difference in pixels; stock against itself shows the run is
deterministic.

Options: ``--model`` (default yolov8s.yaml), ``--device`` (default 0), ``--json PATH`` (the rows).

Examples:
    >>> main(["--model", "yolo11n.yaml", "--json", "parity.json"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cv2
import numpy as np
import torch

from ._timing import detecting_model, environment_line
from .e2e import load_images

IMAGES = 16
MODES = {  # name -> (half, cudnn.allow_tf32)
    "fp32, torch defaults (TF32 on)": (False, True),
    "fp32, TF32 off": (False, False),
    "fp16": (True, True),
}


def varied_images(seed: int = 0) -> list[np.ndarray]:
    """``IMAGES`` images of several sizes from bus.jpg and zidane.jpg: scaled 0.5-1.2, every third mirrored."""
    rng = np.random.default_rng(seed)
    images = []
    for index in range(IMAGES):
        image = load_images()[index % 2]
        scale = rng.uniform(0.5, 1.2)
        image = cv2.resize(image, (int(image.shape[1] * scale), int(image.shape[0] * scale)))
        images.append(np.ascontiguousarray(image[:, ::-1]) if index % 3 == 0 else image)
    return images


def predict_rows(model, images: list[np.ndarray], batch: int, half: bool, conf: float, device: str) -> list:
    """Each image's ``boxes.data`` (float64, on the CPU), predicted ``batch`` images a call."""
    rows = []
    for start in range(0, len(images), batch):
        results = model.predict(images[start : start + batch], batch=batch, half=half, conf=conf, device=device,
                                verbose=False)
        rows += [result.boxes.data.cpu().double() for result in results]
    return rows


def compare(ours: list, stock: list) -> dict:
    """Images that differ at all, images whose box count differs, and the largest box difference (px) where the
    counts agree."""
    differing = sum(1 for a, b in zip(ours, stock) if a.shape != b.shape or not torch.equal(a, b))
    counts = sum(1 for a, b in zip(ours, stock) if a.shape != b.shape)
    largest = max(((a[:, :4] - b[:, :4]).abs().max().item() for a, b in zip(ours, stock)
                   if a.shape == b.shape and len(a)), default=0.0)
    return {"images_differing": differing, "counts_differing": counts, "max_box_diff_px": largest,
            "boxes_stock": sum(len(b) for b in stock)}


def measure(model_name: str, device: str) -> list[dict]:
    import yolo_fastdetect

    model = detecting_model(model_name)
    images = varied_images()
    rows = []
    flag = torch.backends.cudnn.allow_tf32
    try:
        for mode, (half, tf32) in MODES.items():
            torch.backends.cudnn.allow_tf32 = tf32
            for batch in (1, IMAGES):
                for conf in (0.25, 0.001):
                    with yolo_fastdetect.disabled():
                        stock = predict_rows(model, images, batch, half, conf, device)
                        again = predict_rows(model, images, batch, half, conf, device)
                    ours = predict_rows(model, images, batch, half, conf, device)
                    row = {"model": model_name, "mode": mode, "batch": batch, "conf": conf, **compare(ours, stock),
                           "stock_vs_stock_images_differing": compare(again, stock)["images_differing"]}
                    print(row, flush=True)
                    rows.append(row)
    finally:
        torch.backends.cudnn.allow_tf32 = flag
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run the comparison; ``argv`` are the options after ``bench parity``."""
    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench parity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="yolov8s.yaml")
    parser.add_argument("--device", default="0")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench parity needs a CUDA GPU: the modes it compares (TF32, fp16) are the GPU's")
    environment = environment_line()
    print(f"parity with stock: {environment}", flush=True)
    rows = measure(args.model, args.device)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": environment, "rows": rows}, indent=2))
