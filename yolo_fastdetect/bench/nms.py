"""``python -m yolo_fastdetect bench nms``: stock ``non_max_suppression`` against the batched operator.

Part 1 times both on synthetic head outputs ``(B, 84, 8400)`` that look like a trained model's: per image a given
number of candidates above conf 0.25 (clusters of overlapping boxes around objects, a few classes) over a
background of low scores spread log-uniformly down to 1e-8, so validation settings (conf 0.001, multi-label) see
many more candidates than max_nms. Part 2 runs ``model.predict`` on 64 images (bus.jpg and zidane.jpg
alternating) with the NMS patch off and on and prints Ultralytics' own per-image stage times.

torchvision is imported first, so that stock uses ``torchvision.ops.nms`` (its fastest path) rather than the
Python-loop ``TorchNMS``. Both parts print markdown tables; medians after warm-up, CUDA events on a GPU.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from yolo_fastdetect.ops.nms import non_max_suppression, stock_non_max_suppression

from ._timing import detecting_model, single_call_median_ms

NUM_CLASSES = 80
NUM_ANCHORS = 8400  # 640 x 640
IMAGE_SIZE = 640
SETTINGS = {  # name: (conf_thres, iou_thres, multi_label) as the predictor and the validator pass them
    "predict": (0.25, 0.7, False),
    "val": (0.001, 0.7, True),
}


def synthetic_prediction(batch: int, candidates: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """A ``(batch, 4 + 80, 8400)`` head output with ``candidates`` anchors per image scoring above 0.25."""
    generator = torch.Generator().manual_seed(seed)
    prediction = torch.empty(batch, 4 + NUM_CLASSES, NUM_ANCHORS)
    prediction[:, :2] = torch.rand(batch, 2, NUM_ANCHORS, generator=generator) * IMAGE_SIZE
    prediction[:, 2:4] = torch.rand(batch, 2, NUM_ANCHORS, generator=generator) * 150 + 4
    prediction[:, 4:] = 10 ** (torch.rand(batch, NUM_CLASSES, NUM_ANCHORS, generator=generator) * 6 - 8)
    cluster_size = 10
    for image in range(batch):
        anchors = torch.randperm(NUM_ANCHORS, generator=generator)[:candidates]
        classes = torch.randperm(NUM_CLASSES, generator=generator)[:4]
        for cluster in anchors.split(cluster_size):
            centre = torch.rand(2, 1, generator=generator) * IMAGE_SIZE
            size = torch.rand(2, 1, generator=generator) * 200 + 16
            jitter = (torch.rand(4, len(cluster), generator=generator) - 0.5) * 0.3
            prediction[image, :2, cluster] = centre + jitter[:2] * size
            prediction[image, 2:4, cluster] = size * (1 + jitter[2:])
            cls = classes[torch.randint(0, len(classes), (1,), generator=generator)]
            prediction[image, 4 + cls, cluster] = torch.rand(len(cluster), generator=generator) * 0.7 + 0.26
    return prediction.to(device=device, dtype=dtype)


def _agreement(ours: list[torch.Tensor], stock: list[torch.Tensor]) -> str:
    """'yes': the same rows per image (rows of equal score compared as sets); 'ties': the same score sequences but
    other members of a tie group cut by max_nms or max_det (stock's argsort is unstable there, so its own pick is
    arbitrary; common in float16 at conf 0.001); 'NO' otherwise."""

    def canonical(rows: torch.Tensor) -> list:
        return sorted(rows.tolist(), key=lambda row: (-row[4], row))

    if all(canonical(a) == canonical(b) for a, b in zip(ours, stock)):
        return "yes"
    same_scores = all(a.shape == b.shape and torch.equal(a[:, 4], b[:, 4]) for a, b in zip(ours, stock))
    return "ties" if same_scores else "NO"


def bench_operator(device: str, dtype: torch.dtype, repeats: int, batches: list[int],
                   candidate_counts: list[int], settings: list[str]) -> None:
    print(f"\n### non_max_suppression, (B, 84, 8400) {str(dtype).removeprefix('torch.')} on {device}\n")
    print("| batch | candidates/image | settings | stock ms | ours ms | speed-up | same detections |")
    print("|---:|---:|---|---:|---:|---:|---|")
    for batch in batches:
        for candidates in candidate_counts:
            prediction = synthetic_prediction(batch, candidates, dtype, device)
            for name in settings:
                conf, iou, multi_label = SETTINGS[name]
                kwargs = {"conf_thres": conf, "iou_thres": iou, "multi_label": multi_label}
                agreement = _agreement(non_max_suppression(prediction, **kwargs),
                                       stock_non_max_suppression(prediction, **kwargs))
                stock_ms = single_call_median_ms(
                    lambda p=prediction, k=kwargs: stock_non_max_suppression(p, **k), device, repeats
                )
                ours_ms = single_call_median_ms(
                    lambda p=prediction, k=kwargs: non_max_suppression(p, **k), device, repeats
                )
                print(f"| {batch} | {candidates} | {name} (conf {conf}) | {stock_ms:.3f} | {ours_ms:.3f} | "
                      f"{stock_ms / ours_ms:.1f}x | {agreement} |", flush=True)


def bench_predict(model_name: str, device: str, half: bool, runs: int) -> None:
    from ultralytics.utils import ASSETS

    from yolo_fastdetect.patches import nms as nms_patch

    sources = [str(ASSETS / ("bus.jpg" if i % 2 == 0 else "zidane.jpg")) for i in range(64)]
    model = detecting_model(model_name)
    was_applied = nms_patch.is_applied()
    print(f"\n### model.predict, 64 images (bus/zidane), batch 64, {model_name}, half={half}, on {device}: "
          "ms per image (Ultralytics' speed)\n")
    print("| NMS | preprocess | inference | postprocess | detections |")
    print("|---|---:|---:|---:|---:|")
    try:
        for patched in (False, True):
            nms_patch.apply() if patched else nms_patch.revert()
            speeds, detections = [], 0
            for run in range(runs + 1):  # the first run warms up
                results = model.predict(sources, batch=64, device=device, quantize=16 if half else None, verbose=False)
                if run:
                    speeds.append(results[0].speed)
                    detections = sum(len(r.boxes) for r in results)
            stage = {key: statistics.median(s[key] for s in speeds) for key in speeds[0]}
            print(f"| {'yolo_fastdetect' if patched else 'stock'} | {stage['preprocess']:.3f} | "
                  f"{stage['inference']:.3f} | {stage['postprocess']:.3f} | {detections} |", flush=True)
    finally:
        nms_patch.apply() if was_applied else nms_patch.revert()


def main(argv: list[str]) -> None:
    """Run the benchmark; ``argv`` are the options after ``bench nms``."""
    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench nms", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per row (default 20)")
    parser.add_argument("--model", default="yolo11n.yaml", help="model for the predict part (default yolo11n.yaml)")
    parser.add_argument("--predict-runs", type=int, default=5, help="timed predict runs (default 5)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64], help="batch sizes (default 1 16 64)")
    parser.add_argument("--candidates", type=int, nargs="+", default=[100, 3000],
                        help="candidates per image above conf 0.25 (default 100 3000)")
    # Stock takes seconds a call for val at batch 64: an A/B of our kernels can leave those rows out.
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                        help="NMS settings to time (default predict val)")
    parser.add_argument("--skip-predict", action="store_true", help="only time the function")
    parser.add_argument("--skip-function", action="store_true", help="only time model.predict")
    args = parser.parse_args(argv)
    try:  # imported before stock runs, so that stock NMS uses torchvision's kernel, as in a typical process
        import torchvision  # noqa: F401
    except ImportError:
        raise SystemExit(
            "yolo-fastdetect bench nms times stock NMS with torchvision's kernel: pip install torchvision"
        ) from None
    device = args.device if args.device != "cuda" else "cuda:0"
    if device.startswith("cuda"):
        print(f"GPU: {torch.cuda.get_device_name(torch.device(device))}, torch {torch.__version__}")
    if not args.skip_function:
        bench_operator(device, getattr(torch, args.dtype), args.repeats, args.batches, args.candidates, args.settings)
    if not args.skip_predict:
        bench_predict(args.model, device, half=device.startswith("cuda"), runs=args.predict_runs)
