"""roi_features on a real (YAML, random-weight) Ultralytics model, the second-stage demo and the benchmark's CLI."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import yolo_fastdetect
from conftest import HAS_CUDA
from yolo_fastdetect import _ext
from yolo_fastdetect.ops import roi_align

pytestmark = pytest.mark.skipif(not _ext.available(), reason="operators not built")


@pytest.fixture(scope="module")
def prediction():
    """A yolo11n.yaml model with its head captured, and its results on the two Ultralytics images (one batch)."""
    from ultralytics import YOLO
    from ultralytics.utils import ASSETS

    model = YOLO("yolo11n.yaml")
    capture = yolo_fastdetect.capture_head_inputs(model)
    images = [ASSETS / "bus.jpg", ASSETS / "zidane.jpg"]  # 810x1080 and 1280x720: different letterbox padding
    results = model.predict(images, imgsz=320, conf=0.0, max_det=8, batch=2, device="cpu", verbose=False)
    return model, capture, results


def test_detection_rois_invert_scale_boxes(prediction):
    from ultralytics.utils.ops import scale_boxes

    _, capture, results = prediction
    rois = yolo_fastdetect.detection_rois(results, capture.input_shape)
    assert rois.shape == (sum(len(r.boxes) for r in results), 5)
    start = 0
    for index, result in enumerate(results):
        image_rois = rois[start : start + len(result.boxes)]
        start += len(result.boxes)
        assert (image_rois[:, 0] == index).all()
        back = scale_boxes(capture.input_shape, image_rois[:, 1:].clone(), result.orig_shape)
        torch.testing.assert_close(back, result.boxes.xyxy, rtol=0, atol=1e-3)


def test_roi_features_pool_every_level(prediction):
    model, capture, results = prediction
    assert yolo_fastdetect.capture_head_inputs(model) is capture  # idempotent
    pooled = yolo_fastdetect.roi_features(model, results, output_size=5)
    channels = sum(feature.shape[1] for feature in capture.features)
    assert [tuple(p.shape) for p in pooled] == [(len(r.boxes), channels, 5, 5) for r in results]
    rois = yolo_fastdetect.detection_rois(results, capture.input_shape)
    expected = torch.cat(
        [roi_align(f.clone(), rois, 5, 1 / s) for f, s in zip(capture.features, capture.strides.tolist())], 1
    )
    torch.testing.assert_close(torch.cat(pooled), expected)
    # The predictor's copy of the network is found too.
    assert yolo_fastdetect.roi_features(model.predictor, results, output_size=5)[0].shape == pooled[0].shape


def test_roi_features_errors(prediction):
    from ultralytics import YOLO

    _, _, results = prediction
    with pytest.raises(RuntimeError, match="capture_head_inputs"):
        yolo_fastdetect.roi_features(YOLO("yolo11n.yaml"), results)
    model, _, _ = prediction
    with pytest.raises(ValueError, match="batch of 2"):
        yolo_fastdetect.roi_features(model, results[:1])


def test_second_stage_demo():
    path = Path(__file__).resolve().parents[1] / "demo" / "second_stage.py"
    spec = importlib.util.spec_from_file_location("second_stage_demo", path)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    summary = demo.main(["--steps", "4", "--imgsz", "256"])
    assert summary["adapter_grad_norm"] > 0
    assert summary["last_loss"] < summary["first_loss"]


@pytest.mark.skipif(HAS_CUDA, reason="checks the message given without a GPU")
def test_benchmark_needs_a_gpu():
    from yolo_fastdetect.bench import roi_align as bench

    with pytest.raises(SystemExit, match="CUDA"):
        bench.main([])
