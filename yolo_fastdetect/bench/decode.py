"""``python -m yolo_fastdetect bench decode``: stock ``Detect._inference``, its ``torch.compile`` and the fused
operator side by side on yolo12n head shapes (640x640, nc=80, reg_max=16), plus the memory floor.

Options: ``--device cuda|cpu``, ``--batches 1 16 64``, ``--dtypes fp16 fp32``, ``--no-compile``,
``--predict`` (also time ``model.predict`` of a YAML yolo12n, stock vs patched).
"""

from __future__ import annotations

import argparse

import torch
from ultralytics.nn.modules.head import Detect

from ..ops import detect_decode_reference
from ..patches import detect_head
from ._timing import copy_bandwidth_gbs, environment_line, graph_median_ms, median_ms

LEVEL_SHAPES = [(80, 80), (40, 40), (20, 20)]
NUM_ANCHORS = sum(h * w for h, w in LEVEL_SHAPES)
FLAT_LEVEL_SHAPES = [size for shape in LEVEL_SHAPES for size in shape]  # the operator's [h0, w0, h1, w1, ...]
LEVEL_STRIDES = [8.0, 16.0, 32.0]
NUM_CLASSES, REG_MAX = 80, 16
DTYPES = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}
ROTATION_BYTES = 256 << 20  # input sets rotated per timing, together larger than the H200's 60 MB L2


def make_head(device: str, dtype: torch.dtype) -> Detect:
    """A yolo12n-shaped Detect head (its convolutions are not run: only its decode is timed)."""
    head = Detect(nc=NUM_CLASSES, ch=(64, 128, 256)).eval().to(device, dtype)
    head.stride = torch.tensor(LEVEL_STRIDES, device=device)
    return head


def make_inputs(batch: int, device: str, dtype: torch.dtype) -> list[tuple[dict]]:
    """Several sets of random head outputs (never zeros) in the layout Detect.forward_head returns."""
    set_bytes = batch * NUM_ANCHORS * (4 * REG_MAX + NUM_CLASSES) * torch.finfo(dtype).bits // 8
    sets = []
    for _ in range(max(2, min(8, ROTATION_BYTES // set_bytes))):
        boxes = torch.randn(batch, 4 * REG_MAX, NUM_ANCHORS, device=device, dtype=dtype) * 3
        scores = torch.randn(batch, NUM_CLASSES, NUM_ANCHORS, device=device, dtype=dtype) * 4 - 2
        feats = [torch.empty(batch, 1, h, w, device=device, dtype=dtype) for h, w in LEVEL_SHAPES]  # shapes only
        sets.append(({"boxes": boxes, "scores": scores, "feats": feats},))
    return sets


def time_decode(batch: int, dtype_name: str, device: str, compile_stock: bool, bandwidth: float | None) -> dict:
    dtype = DTYPES[dtype_name]
    head = make_head(device, dtype)
    inputs = make_inputs(batch, device, dtype)
    stock = detect_head.PATCH.original("_inference") if detect_head.is_applied() else Detect._inference

    def run_stock(x):
        return stock(head, x)

    def run_ours(x):
        return torch.ops.yolo_fastdetect.detect_decode(x["boxes"], x["scores"], FLAT_LEVEL_SHAPES, LEVEL_STRIDES,
                                                       REG_MAX, True)

    def run_patched(x):
        return detect_head.fast_inference(head, x)

    with torch.inference_mode():
        # sanity check: float32 against float64 (stock runs TF32 on CUDA); half against the reference in its dtype,
        # which rounds between steps as stock and the operator do
        x = inputs[0][0]
        exact = dtype == torch.float32
        boxes, scores = (x["boxes"].double(), x["scores"].double()) if exact else (x["boxes"], x["scores"])
        reference = detect_decode_reference(boxes, scores, LEVEL_SHAPES, LEVEL_STRIDES).double()
        relative_error = ((run_ours(x).double() - reference).abs().max() / reference.abs().max()).item()
        assert relative_error < 2 * torch.finfo(dtype).eps, f"fused decode is off by {relative_error}"
        row = {"batch": batch, "dtype": dtype_name}
        row["stock"] = median_ms(run_stock, inputs, device)
        row["ours"] = median_ms(run_ours, inputs, device)
        row["patched _inference"] = median_ms(run_patched, inputs, device)
        if compile_stock:
            compiled = torch.compile(run_stock, dynamic=False)
            row["torch.compile"] = median_ms(compiled, inputs, device)
        if device == "cuda":
            row["stock (graph)"] = graph_median_ms(run_stock, inputs)
            row["ours (graph)"] = graph_median_ms(run_ours, inputs)
            moved = batch * NUM_ANCHORS * (4 * REG_MAX + 2 * NUM_CLASSES + 4) * torch.finfo(dtype).bits // 8
            row["floor"] = moved / (bandwidth * 1e9) * 1e3
    return row


def time_predict(batches: list[int], device: str) -> list[dict]:
    """End-to-end model.predict of a YAML yolo12n (fp16 on CUDA) on the wheel's images, stock vs patched."""
    from ultralytics import YOLO
    from ultralytics.utils import ASSETS

    import yolo_fastdetect

    model = YOLO("yolo12n.yaml")
    images = [str(ASSETS / name) for name in ("bus.jpg", "zidane.jpg")]
    rows = []
    for batch in batches:
        sources = [images[i % 2] for i in range(batch)]
        row = {"batch": batch}
        for label, switch in (("stock", yolo_fastdetect.disable), ("patched", yolo_fastdetect.enable)):
            switch()
            kwargs = dict(device=0 if device == "cuda" else "cpu", half=device == "cuda", verbose=False, batch=batch)
            for _ in range(3):  # warm-up (predictor set-up, cuDNN autotuning)
                model.predict(sources, **kwargs)
            speeds = []
            for _ in range(5):
                results = model.predict(sources, **kwargs)
                speeds.append(results[0].speed["inference"])
            row[f"{label} inference ms/img"] = sorted(speeds)[len(speeds) // 2]
        rows.append(row)
    yolo_fastdetect.enable()
    return rows


def print_table(rows: list[dict]) -> None:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = [f"{row.get(c):.4f}" if isinstance(row.get(c), float) else str(row.get(c, "-")) for c in columns]
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench decode", description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--dtypes", nargs="+", default=None, choices=list(DTYPES))
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile of the stock decode")
    parser.add_argument("--predict", action="store_true", help="also time model.predict stock vs patched")
    args = parser.parse_args(argv)
    from .. import _ext

    _ext.require()
    cuda = args.device == "cuda"
    batches = args.batches or ([1, 16, 64] if cuda else [1, 8])
    dtypes = args.dtypes or (["fp16", "fp32"] if cuda else ["fp32"])
    bandwidth = copy_bandwidth_gbs() if cuda else None
    print(f"decode benchmark: {environment_line()}")
    if bandwidth:
        print(f"measured device-to-device copy bandwidth: {bandwidth:.0f} GB/s (floor = bytes moved / this)")
    print("times in ms per call, median; eager columns include launch overhead, (graph) columns do not")
    rows = [time_decode(b, d, args.device, not args.no_compile, bandwidth) for d in dtypes for b in batches]
    print_table(rows)
    if args.predict:
        print(f"\nmodel.predict, yolo12n.yaml {'fp16' if cuda else 'fp32'}, Ultralytics' inference ms per image")
        print_table(time_predict(batches, args.device))
