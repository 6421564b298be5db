"""Check yolo_fastdetect against the Ultralytics this interpreter imports, and print one JSON object.

``python -m yolo_fastdetect.bench._version_check [--device cpu|0] [--quick]`` imports the package (which
patches), records each patch's state and the warnings, checks that ``disable()``/``enable()`` round-trip, then runs
stock (``yolo_fastdetect.disabled()``) and patched Ultralytics on the same seeded YAML models and the wheel's images
in this one process and compares: ``predict`` of YOLOv8, YOLO11 (YOLO12 and YOLO26 where the release has them), one
Segment and one Pose model at conf 0.25 and 0.001, on one image and on a batch of two sizes; ``predict`` of a folder
and of a list of paths (the file sources); ``val`` of YOLOv8 and YOLO11 on a four-image labelled set. One interpreter
serves one release, so the version matrix (``tests/test_versions.py``) and the pre-release guard
(:mod:`yolo_fastdetect.bench.versions`) run this module once per release with that release first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

# Boxes (input pixels), scores and mask/keypoint values may differ by this much: the fused decode rounds differently
# from stock's DFL convolution (see ULTRALYTICS_NOTES.md, "Numerics").
ATOL = 1e-3
# The class convolutions' weights scaled so that scores differ from box to box: tied scores leave the order of the
# boxes NMS keeps to each implementation (see bench._timing.detecting_model).
LOGIT_SCALE = 1e7
# A box edge that moves by ATOL can move a whole row of a mask's crop (the seeded models' boxes lie on whole pixels).
MASK_SHARE = 1e-3
PREDICT_IMGSZ = (256, 192)  # (height, width): small, and the 3:4 of the images (see write_images)
VAL_IMGSZ = 320
SAME_ERROR = "stock and patched raise the same"  # a check this release cannot run: reported as such
DETECT_FAMILIES = ("yolov8n", "yolo11n", "yolo12n", "yolo26n")
TASK_MODELS = ("yolo11n-seg", "yolo11n-pose")
VAL_MODELS = ("yolov8n", "yolo11n")


def available_configs(names: tuple[str, ...]) -> list[str]:
    """The ``name.yaml`` configs this Ultralytics ships (``yolo12n`` from ``yolo12.yaml``, with its scale)."""
    import ultralytics

    models = Path(ultralytics.__file__).parent / "cfg" / "models"
    shipped = {path.stem for path in models.rglob("*.yaml")}
    return [f"{name}.yaml" for name in names if _family(name) in shipped]


def _family(name: str) -> str:
    """``yolo11n-seg`` -> ``yolo11-seg``: the YAML a scaled name is built from."""
    base, _, task = name.partition("-")
    return base[:-1] + (f"-{task}" if task else "")


def seeded_model(config: str, device: str):
    """The benchmarks' seeded detecting model (:func:`yolo_fastdetect.bench._timing.detecting_model`, class logits
    scaled by :data:`LOGIT_SCALE`), with ``kpt_shape`` where a pose YAML gives it: 8.3's predictor reads it from the
    network, which a checkpoint carries and a YAML build (until 8.4) does not."""
    from ._timing import detecting_model

    model = detecting_model(config, device, LOGIT_SCALE)
    if "kpt_shape" in model.model.yaml and not hasattr(model.model, "kpt_shape"):
        model.model.kpt_shape = tuple(model.model.yaml["kpt_shape"])
    return model


def _differences(stock, ours) -> str | None:
    """How one image's ``Results`` differ, or None where they agree: boxes (with scores and classes) and keypoints
    within :data:`ATOL` (box corners within 1 where stock rounded them), masks in at most :data:`MASK_SHARE` of their
    pixels."""
    import torch

    pairs = {name: (getattr(stock, name, None), getattr(ours, name, None)) for name in ("boxes", "keypoints", "masks")}
    for name, (a, b) in pairs.items():
        if a is None and b is None:
            continue
        if a is None or b is None or a.data.shape != b.data.shape:
            return f"{name}: {getattr(a, 'shape', None)} vs {getattr(b, 'shape', None)}"
        x, y = a.data.float().cpu(), b.data.float().cpu()
        if name == "masks":
            share = (x != y).float().mean().item() if x.numel() else 0.0
            if share > MASK_SHARE:
                return f"masks: {share:.2%} of the pixels differ"
            continue
        tolerance = torch.full_like(x, ATOL)
        if name == "boxes" and bool((x[:, :4] == x[:, :4].round()).all()):
            tolerance[:, :4] = 1.0  # a release that rounds the boxes (8.3.0's pose) turns ATOL at .5 into 1
        if ((x - y).abs() > tolerance).any():
            return f"{name}: up to {(x - y).abs().max().item():.3g} apart"
    return None


def compare_results(stock: list, ours: list) -> tuple[bool, str]:
    """Whether two lists of ``Results`` hold the same detections, and some, with a detail line.

    Each image's outputs must agree in order (:func:`_differences`), or else, where boxes share a score (the seeded
    models score the constant letterbox padding alike, and NMS implementations order such ties as they like), the
    boxes must agree as :func:`yolo_fastdetect.bench.e2e.detection_difference` compares them: as many on each side,
    and every box whose score no other shares within :data:`ATOL` of a stock box of its class and score (the tied ones
    are counted in the detail; their masks and keypoints are not compared)."""
    from .e2e import detection_difference

    if len(stock) != len(ours):
        return False, f"{len(stock)} stock results, {len(ours)} patched"
    tied = 0
    for index, (a, b) in enumerate(zip(stock, ours)):
        difference = _differences(a, b)
        if difference is None:
            continue
        apart = detection_difference([b], [a], conf_atol=ATOL)
        if not apart["same_counts"] or apart["max_box_diff_px_untied"] > ATOL * max(a.orig_shape):
            return False, f"image {index}: {difference}"
        tied += apart["tied"]
    boxes = sum(len(r.boxes) for r in stock)
    detail = f"{boxes} boxes" + (f", {tied} tied ones in another order" if tied else "")
    return boxes > 0, detail + ("" if boxes else " (nothing detected: the comparison would prove nothing)")


def _outcome(run: Callable[[], object]) -> tuple[object, str | None]:
    """``run()``'s result and None, or None and the error it raised."""
    try:
        return run(), None
    except Exception as error:  # noqa: BLE001 - compared with the other side's, not raised
        return None, f"{type(error).__name__}: {error}"


def stock_against_patched(run: Callable[[], object], compare: Callable[[object, object], tuple[bool, str]],
                          patched_runs: int = 1) -> tuple[bool, str]:
    """``compare`` of ``run()`` with the package off and on, the patched side ``patched_runs`` times (on a GPU three: a
    shape's first batch runs eagerly, the second is captured in a CUDA graph, the third replays it). Where stock raises
    (a release that cannot run this check) the patched run must raise the same."""
    import yolo_fastdetect

    with yolo_fastdetect.disabled():
        stock, stock_error = _outcome(run)
    for attempt in range(patched_runs):
        ours, our_error = _outcome(run)
        if stock_error is None and our_error is None:
            ok, detail = compare(stock, ours)
            if not ok or attempt == patched_runs - 1:
                return ok, detail + (f" (patched run {attempt + 1} of {patched_runs})" if patched_runs > 1 else "")
        elif stock_error == our_error:
            return True, f"{SAME_ERROR}: {stock_error}"
        else:
            return False, f"stock: {stock_error or 'ran'}; patched: {our_error or 'ran'}"


def same_metrics(stock: dict, ours: dict) -> tuple[bool, str]:
    """Whether two validations' metrics are equal, and some box was found."""
    recall = ours.get("metrics/recall(B)", 0)
    return stock == ours and recall > 0, f"recall {recall:.4f}" if stock == ours else f"{stock} != {ours}"


class Checks:
    """The checks of one run: each a name, whether it passed, a detail and its seconds."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def run(self, name: str, check: Callable[[], tuple[bool, str]]) -> None:
        """Run ``check`` and record it; an exception is a failed check with its message."""
        begin = time.perf_counter()
        try:
            ok, detail = check()
        except Exception as error:  # noqa: BLE001 - reported, not raised: the other checks still run
            ok, detail = False, f"{type(error).__name__}: {error}"
        self.rows.append({"name": name, "ok": bool(ok), "detail": detail,
                          "seconds": round(time.perf_counter() - begin, 2)})


def check_enable_disable() -> tuple[bool, str]:
    """``disable()`` turns every patch off and ``enable()`` puts back the same states, twice over."""
    import yolo_fastdetect
    from yolo_fastdetect import patches

    before = patches.states()
    for _ in range(2):
        yolo_fastdetect.disable()
        if yolo_fastdetect.is_enabled() or any(state == "on" for state in patches.states().values()):
            return False, f"still on after disable(): {patches.states()}"
        yolo_fastdetect.enable()
        if patches.states() != before:
            return False, f"enable() gave {patches.states()}, import gave {before}"
    return True, "round trip twice"


def write_images(folder: Path) -> list[str]:
    """The wheel's bus.jpg and a copy at half its size, written to ``folder``: the same 3:4 aspect as
    :data:`PREDICT_IMGSZ`, so the letterbox adds no padding, whose constant pixels the seeded models score alike
    (ties that a one-ulp difference of the fused decode's sigmoid orders differently in NMS)."""
    import cv2

    from ._tiny_dataset import asset_images

    bus = cv2.imread(asset_images()[0])
    paths = [str(folder / "bus.jpg"), str(folder / "bus_half.jpg")]
    cv2.imwrite(paths[0], bus)
    cv2.imwrite(paths[1], cv2.resize(bus, (bus.shape[1] // 2, bus.shape[0] // 2), interpolation=cv2.INTER_AREA))
    return paths


def predict_checks(checks: Checks, device: str, quick: bool) -> None:
    """Stock against patched ``predict`` for every model, conf and batch, and for the file sources (see the module
    docstring)."""
    import cv2

    runs = 1 if device == "cpu" else 3  # see stock_against_patched
    with tempfile.TemporaryDirectory() as folder:
        paths = write_images(Path(folder))
        images = [cv2.imread(path) for path in paths]
        batches = {"batch 1": images[:1], "mixed sizes": images}
        configs = available_configs(DETECT_FAMILIES) + available_configs(TASK_MODELS)
        for config in configs[:1] if quick else configs:
            model = seeded_model(config, device)
            for conf in (0.25, 0.001):
                for label, batch in batches.items():
                    def predict(batch=batch, conf=conf, model=model):
                        return model.predict(batch, imgsz=PREDICT_IMGSZ, conf=conf, device=device, verbose=False)

                    checks.run(f"predict {config} conf={conf} {label}",
                               lambda predict=predict: stock_against_patched(predict, compare_results, runs))
        model = seeded_model(configs[0], device)
        for label, source in (("folder", folder), ("list of paths", paths)):
            # Two images a batch, as stock reads a list at once: the same batches on both sides (a batch's size
            # changes the CPU convolutions' rounding).
            def predict(source=source):
                return model.predict(source, imgsz=PREDICT_IMGSZ, batch=2, device=device, verbose=False)

            checks.run(f"predict {configs[0]} file source: {label}",
                       lambda predict=predict: stock_against_patched(predict, compare_results, runs))


def val_checks(checks: Checks, device: str, quick: bool) -> None:
    """Stock against patched ``val`` metrics on the tiny labelled set (conf 0.001, validation's default)."""
    from ._tiny_dataset import write_tiny_dataset

    with tempfile.TemporaryDirectory() as root:
        data = write_tiny_dataset(Path(root) / "dataset", num_classes=80)
        configs = available_configs(VAL_MODELS)
        for config in configs[:1] if quick else configs:
            model = seeded_model(config, device)

            def val(model=model, config=config):
                return model.val(data=str(data), imgsz=VAL_IMGSZ, batch=2, device=device, conf=0.001, plots=False,
                                 workers=0, verbose=False, project=str(Path(root) / "runs"), name=config).results_dict

            checks.run(f"val {config} conf=0.001", lambda val=val: stock_against_patched(val, same_metrics))


def main(argv: list[str] | None = None) -> None:
    """Run every check and print the JSON report (``--help`` for the options)."""
    parser = argparse.ArgumentParser(prog="python -m yolo_fastdetect.bench._version_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, or a CUDA index such as 0")
    parser.add_argument("--quick", action="store_true", help="one model for predict and val (import checks all)")
    args = parser.parse_args(argv)
    begin = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import yolo_fastdetect
        from yolo_fastdetect import patches
        from yolo_fastdetect.cli import patch_state
    report = {
        "ultralytics": patches.ultralytics_version(),
        "warnings": [str(w.message) for w in caught if "yolo_fastdetect" in str(w.message)],
        "enabled": yolo_fastdetect.is_enabled(),
        "patches": patches.states(),
        "state_line": patch_state(),  # what `yolo-fastdetect info` and the CLI's start-up line say
    }
    checks = Checks()
    checks.run("enable/disable", check_enable_disable)
    if report["ultralytics"] is not None:
        import numpy as np

        # Imported first, as Ultralytics 8.4.190 does itself: without it, older releases' stock NMS is their TorchNMS,
        # whose unstable sort orders tied scores as it likes (the drop-in orders them by anchor, as torchvision's
        # kernel does), and the seeded models tie on the letterbox padding.
        import torchvision  # noqa: F401

        if not hasattr(np, "trapz"):  # numpy 2 removed trapz, which the metrics of 8.3.100 and older call
            np.trapz = np.trapezoid

        device = args.device if args.device == "cpu" else f"cuda:{args.device}"
        with contextlib.redirect_stdout(sys.stderr):  # Ultralytics' prints must not mix with the JSON
            predict_checks(checks, device, args.quick)
            val_checks(checks, device, args.quick)
    report["checks"] = checks.rows
    report["ok"] = all(row["ok"] for row in checks.rows)
    report["seconds"] = round(time.perf_counter() - begin, 1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
