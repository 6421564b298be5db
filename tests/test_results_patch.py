"""The patched ``DetectionPredictor.construct_results`` (stock's ``ops.scale_boxes`` once per image size of the
batch) against stock's, which scales each image's boxes: the same Results bit for bit, with the package on and off."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from ultralytics.models.yolo.detect import DetectionPredictor

import yolo_fastdetect
from conftest import asset_images, detecting_model, devices
from yolo_fastdetect import _ext
from yolo_fastdetect.ops.nms import batched_nms, non_max_suppression
from yolo_fastdetect.patches import postprocess as postprocess_patch
from yolo_fastdetect.patches import results as results_patch

pytestmark = pytest.mark.skipif(not _ext.available(), reason="operators not built")


@pytest.fixture(autouse=True)
def restore_patch():
    yield
    yolo_fastdetect.enable()


def test_apply_revert_and_enable_disable():
    assert results_patch.is_applied()
    stock = results_patch.PATCH.original("construct_results")
    yolo_fastdetect.disable()
    assert not results_patch.is_applied() and DetectionPredictor.construct_results is stock
    yolo_fastdetect.enable()
    yolo_fastdetect.enable()  # idempotent
    assert DetectionPredictor.construct_results is results_patch.construct_results


def test_padded_batch_is_the_record_of_the_batched_nms_rows(generator):
    prediction = torch.rand(3, 4 + 2, 500, generator=generator) * torch.tensor([640, 640, 80, 80, 1, 1]).view(-1, 1)
    rows = non_max_suppression(prediction, max_det=20)
    batch = results_patch.padded_batch(rows)
    assert batch is not None and batch.shape == (3, 20, 6)
    assert all(torch.equal(row, batch[image, : len(row)]) for image, row in enumerate(rows))
    assert all(row.data_ptr() == batch[image].data_ptr() for image, row in enumerate(rows))
    assert results_patch.padded_batch(rows[:2]) is None  # not every image of the batch
    assert results_patch.padded_batch([row.clone() for row in rows]) is None
    assert results_patch.padded_batch(rows[::-1]) is None
    assert results_patch.padded_batch([]) is None
    masks = torch.rand(2, 4 + 2 + 3, 500, generator=generator)  # Segment's rows carry mask coefficients
    assert results_patch.padded_batch(non_max_suppression(masks, nc=2, conf_thres=0.1)) is None
    # The same views in a list of its own carry no record: the rows are not guessed from their storage.
    detections, counts, _ = batched_nms(prediction, 2)
    assert results_patch.padded_batch([detections[i, : int(n)] for i, n in enumerate(counts)]) is None
    rows[1] = rows[1][:1]  # a callback that filters an image's rows in place: the padded tensor no longer matches
    assert results_patch.padded_batch(rows) is None


def batch_images(sizes: str) -> list[np.ndarray]:
    """``one size``: bus.jpg, flipped and not; ``mixed``: bus.jpg twice among two other sizes (zidane.jpg, and a
    small flipped copy of it). Flipped images put boxes against the borders, where the clamp acts."""
    bus, zidane = (cv2.imread(path) for path in asset_images())
    if sizes == "one size":
        return [bus, np.ascontiguousarray(bus[::-1]), bus]
    return [bus, zidane, np.ascontiguousarray(cv2.resize(zidane, (517, 301))[::-1]), bus]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("sizes", ["one size", "mixed"])
@pytest.mark.parametrize("stock_side", ["package off", "results patch off"])
def test_predict_same_results_as_stock(device, sizes, stock_side, monkeypatch):
    """One batch of images of one size or of three, against stock with only this patch off (the same decode and
    NMS on both sides: the same boxes, scores, classes and Results bit for bit) and with the package off (the fused
    decode rounds a box coordinate differently at times: 6e-5 px at most on the CPU); the batched path ran. Scores
    are untied (logit_scale), so stock's NMS order is ours."""
    model = detecting_model(device, logit_scale=1e7)
    images = batch_images(sizes)
    options = {"device": device, "verbose": False, "imgsz": 320, "batch": len(images)}
    yolo_fastdetect.disable() if stock_side == "package off" else results_patch.revert()
    stock = model.predict(images, **options)
    yolo_fastdetect.enable()
    postprocess_patch.revert()  # on a GPU its graph takes a batch of one size: here construct_results is tested
    scaled = []
    original = results_patch.scale_by_size
    monkeypatch.setattr(results_patch, "scale_by_size", lambda *a, **k: scaled.append(1) or original(*a, **k))
    ours = model.predict(images, **options)
    assert scaled == [1], "the batched scaling did not run"
    assert len(ours) == len(stock) == len(images)
    for mine, theirs in zip(ours, stock):
        assert len(theirs.boxes) > 0
        atol = 0 if stock_side == "results patch off" else 1e-3
        torch.testing.assert_close(mine.boxes.data, theirs.boxes.data, rtol=0, atol=atol)
        assert mine.orig_shape == theirs.orig_shape and mine.path == theirs.path and mine.names == theirs.names
    assert any((result.boxes.xyxy[:, 2:] == torch.tensor(result.orig_shape[::-1], device=device)).any()
               for result in ours), "no box reached the clamp"


@pytest.mark.parametrize("device", devices())
def test_segment_and_own_construct_result_run_stock(device, monkeypatch):
    """Predictors that build their results otherwise (Segment, a subclass overriding construct_result) never take
    the batched path."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the batched scaling ran")

    monkeypatch.setattr(results_patch, "scale_by_size", forbidden)
    image = cv2.imread(asset_images()[0])
    detecting_model(device, "yolo11n-seg.yaml").predict(image, device=device, verbose=False, imgsz=320)

    class OwnResults(DetectionPredictor):
        def construct_result(self, pred, img, orig_img, img_path):
            return super().construct_result(pred, img, orig_img, img_path)

    results = detecting_model(device).predict(image, predictor=OwnResults, device=device, verbose=False, imgsz=320)
    assert len(results) == 1 and len(results[0].boxes) > 0
