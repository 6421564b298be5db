"""The patched ``DetectionPredictor.postprocess`` (NMS and box scaling replayed from a CUDA graph) against stock's:
the same Results bit for bit with only this patch off, stock's detections with the package off, and the stock
method wherever the graph does not apply."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from ultralytics.models.yolo.detect import DetectionPredictor

import yolo_fastdetect
from conftest import assert_same_results_bitwise, asset_images, detecting_model
from yolo_fastdetect import _ext
from yolo_fastdetect.patches import nms as nms_patch
from yolo_fastdetect.patches import postprocess as postprocess_patch
from yolo_fastdetect.patches import predictor as predictor_patch

pytestmark = pytest.mark.skipif(not _ext.available(), reason="operators not built")


@pytest.fixture(autouse=True)
def restore_patch():
    postprocess_patch._cache.clear()
    yield
    yolo_fastdetect.enable()


def test_apply_revert_and_enable_disable():
    assert postprocess_patch.is_applied()
    stock = postprocess_patch.PATCH.original("postprocess")
    yolo_fastdetect.disable()
    assert not postprocess_patch.is_applied() and DetectionPredictor.postprocess is stock
    yolo_fastdetect.enable()
    yolo_fastdetect.enable()  # idempotent
    assert DetectionPredictor.postprocess is postprocess_patch.postprocess


def test_cpu_runs_the_stock_method():
    """On the CPU no graph is made and the results are those of stock's postprocess, bit for bit."""
    model = detecting_model("cpu")
    images = [cv2.imread(path) for path in asset_images()]
    postprocess_patch.revert()
    stock = [model.predict(image, device="cpu", verbose=False, imgsz=320)[0] for image in images * 2]
    postprocess_patch.apply()
    ours = [model.predict(image, device="cpu", verbose=False, imgsz=320)[0] for image in images * 2]
    assert postprocess_patch.graph_count() == 0
    assert sum(len(result.boxes) for result in stock) > 0
    for mine, theirs in zip(ours, stock):
        assert torch.equal(mine.boxes.data, theirs.boxes.data)


# CUDA ------------------------------------------------------------------------------------------------------------


def images_of(kind: str) -> list[np.ndarray]:
    """Batches by kind. Flipped copies put boxes against the borders, where stock's clamp acts."""
    bus, zidane = (cv2.imread(path) for path in asset_images())
    return {
        "bus": [bus],
        "zidane": [zidane],
        "flipped": [np.ascontiguousarray(zidane[::-1, ::-1])],
        "two of one size": [bus, np.ascontiguousarray(bus[::-1])],
        "mixed sizes": [bus, zidane],
        "nine": [bus] * 9,
    }[kind]


def run(model, kinds: list[str], **options) -> list:
    """Each batch of ``kinds`` predicted in turn on one predictor; every Result, kept until the end (so a graph
    that rewrote the memory of an earlier call's Results would show)."""
    results = []
    for kind in kinds:
        results += model.predict(images_of(kind), device="cuda", verbose=False, **options)
    return results


# Three keys (zidane and its flipped copy share one), each called at least three times: eager, captured, replayed.
SEQUENCE = ["bus", "zidane", "flipped", "two of one size"] * 3


@pytest.mark.cuda
@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_same_results_as_stock_postprocess(half):
    """Batches of one and two images of one size, each key three times, in torch's default flags: against stock's
    postprocess with the rest of the package on (the same NMS and scaling kernels) and against the package off (stock's
    decode and NMS), bit for bit. fp32 scores are untied (logit_scale), so NMS orders agree; fp16 cannot hold those
    logits, and its tied scores may list their boxes in another order."""
    model = detecting_model("cuda", "yolov8n.yaml", logit_scale=1.0 if half else 1e7)
    options = {"half": half, "batch": 2}
    ours = run(model, SEQUENCE, **options)
    assert postprocess_patch.graph_count() == 3, "one graph per batch shape and original size"
    postprocess_patch.revert()
    eager = run(model, SEQUENCE, **options)
    assert len(ours) == len(eager) and sum(len(result.boxes) for result in ours) > 0
    for mine, theirs in zip(ours, eager):
        assert torch.equal(mine.boxes.data, theirs.boxes.data)
        assert mine.orig_shape == theirs.orig_shape and mine.path == theirs.path and mine.names == theirs.names
    assert any((result.boxes.xyxy[:, :2] == 0).any()
               or (result.boxes.xyxy[:, 2:] == torch.tensor(result.orig_shape[::-1], device="cuda")).any()
               for result in ours), "no box reached the clamp"
    with yolo_fastdetect.disabled():
        stock = run(model, SEQUENCE, **options)
    assert_same_results_bitwise(ours, stock)


@pytest.mark.cuda
def test_filters_and_limits_are_part_of_the_key():
    """conf, classes and max_det are baked into a graph: each setting gets its own, with stock's results."""
    model = detecting_model("cuda", "yolov8n.yaml", logit_scale=1e7)
    settings = [{"conf": 0.25}, {"conf": 0.6}, {"classes": [5]}, {"max_det": 7}, {"agnostic_nms": True}]
    ours = [run(model, ["bus"] * 3, **setting)[-1] for setting in settings]
    assert postprocess_patch.graph_count() == len(settings)
    postprocess_patch.revert()
    for setting, mine in zip(settings, ours):
        theirs = run(model, ["bus"], **setting)[0]
        assert torch.equal(mine.boxes.data, theirs.boxes.data), setting
    assert len(ours[3].boxes) == 7 and set(ours[2].boxes.cls.tolist()) == {5.0}


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["mixed sizes", "nine images", "graphs off", "stock NMS", "segment", "pose",
                                  "own construct_result"])
def test_declined_cases_run_the_stock_method(case, monkeypatch):
    """Where the graph does not apply, postprocess is stock's: no graph, the same Results as with the patch off."""
    config = {"segment": "yolo11n-seg.yaml", "pose": "yolo11n-pose.yaml"}.get(case, "yolov8n.yaml")
    model = detecting_model("cuda", config, logit_scale=1e7)
    kinds = {"mixed sizes": ["mixed sizes"], "nine images": ["nine"]}.get(case, ["bus"]) * 3
    options = {"batch": 9}
    if case == "graphs off":
        monkeypatch.setenv(predictor_patch.GRAPHS_VARIABLE, "0")
    if case == "stock NMS":
        nms_patch.revert()
    if case == "own construct_result":
        class OwnResults(DetectionPredictor):
            def construct_result(self, pred, img, orig_img, img_path):
                return super().construct_result(pred, img, orig_img, img_path)

        options["predictor"] = OwnResults
    ours = run(model, kinds, **options)
    assert postprocess_patch.graph_count() == 0
    postprocess_patch.revert()
    model.predictor = None
    stock = run(model, kinds, **options)
    assert sum(len(result.boxes) for result in stock) > 0
    for mine, theirs in zip(ours, stock):
        assert torch.equal(mine.boxes.data, theirs.boxes.data)


@pytest.mark.cuda
def test_nonfinite_box_hands_the_batch_to_stock():
    """A NaN box coordinate: the graph's flag sends the batch to the stock method, every call (captured or not)."""
    model = detecting_model("cuda", "yolov8n.yaml", logit_scale=1e7)
    image = images_of("bus")
    model.predict(image, device="cuda", verbose=False)
    predictor = model.predictor
    with torch.inference_mode():
        img = predictor.preprocess(image)
        prediction = predictor.inference(img)[0].clone()
        prediction[0, 0, 17] = float("nan")
        ours = [predictor.postprocess(prediction, img, image)[0] for _ in range(3)]
        stock = postprocess_patch.PATCH.original("postprocess")(predictor, prediction, img, image)[0]
    assert postprocess_patch.graph_count() == 1  # captured, and still declined by its flag
    for mine in ours:
        assert torch.equal(mine.boxes.data, stock.boxes.data)
