"""The patched DetectionPredictor (letterbox on the GPU, forward pass from CUDA graphs) against stock Ultralytics.

On the CPU the patch must change nothing (both paths are CUDA-only) and its letterbox arguments must reproduce stock
preprocessing; on a GPU, model.predict with the patch must give stock's detections.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
import ultralytics.engine.predictor as engine_predictor
from ultralytics.engine.predictor import BasePredictor
from ultralytics.models.yolo.detect import DetectionPredictor
from ultralytics.models.yolo.obb import OBBPredictor
from ultralytics.models.yolo.pose import PosePredictor
from ultralytics.models.yolo.segment import SegmentationPredictor
from ultralytics.utils import torch_utils

import yolo_fastdetect
from conftest import asset_images, detecting_model, devices
from yolo_fastdetect import letterbox, letterbox_geometry, patches
from yolo_fastdetect.bench.e2e import detection_difference
from yolo_fastdetect.graphs import default_cache
from yolo_fastdetect.patches import postprocess as postprocess_patch
from yolo_fastdetect.patches import predictor as predictor_patch
from yolo_fastdetect.patches import sources as sources_patch
from yolo_fastdetect.sources import ImageBatch

PREDICTOR_CLASSES = (BasePredictor, DetectionPredictor, SegmentationPredictor, PosePredictor, OBBPredictor)


@pytest.fixture(autouse=True)
def restore_patch():
    yield
    yolo_fastdetect.enable()


def asset_arrays() -> list[np.ndarray]:
    """bus.jpg (1080x810) and zidane.jpg (720x1280) decoded as the predictor's loader does (cv2, BGR)."""
    return [cv2.imread(path) for path in asset_images()]


def set_up_predictor(model, device: str, **kwargs) -> DetectionPredictor:
    """The model's predictor after one prediction (model set up, imgsz checked) with these arguments."""
    model.predict(asset_arrays()[0], device=device, verbose=False, **kwargs)
    return model.predictor


def class_dicts() -> dict[type, dict]:
    return {cls: dict(cls.__dict__) for cls in PREDICTOR_CLASSES}


def test_apply_and_revert_restore_the_class_dicts_exactly():
    yolo_fastdetect.disable()
    stock = class_dicts()
    methods = {"setup_source", "preprocess", "inference"}
    assert not methods & DetectionPredictor.__dict__.keys()
    yolo_fastdetect.enable()
    patched = class_dicts()
    for name in methods:
        module = sources_patch if name == "setup_source" else predictor_patch
        assert patched[DetectionPredictor][name] is getattr(module, name)
    added = set(patched[DetectionPredictor]) - set(stock[DetectionPredictor])
    assert added == methods
    # The results and postprocess patches replace methods that DetectionPredictor defines (tested in
    # test_results_patch and test_postprocess_patch).
    replaced = {"construct_results", "postprocess"}
    assert all(patched[DetectionPredictor][name] is not stock[DetectionPredictor][name] for name in replaced)
    for cls in PREDICTOR_CLASSES:  # nothing else changed, on DetectionPredictor or elsewhere
        kept = stock[cls].keys() - (replaced if cls is DetectionPredictor else set())
        unchanged = {k: v for k, v in patched[cls].items() if cls is not DetectionPredictor or k in kept}
        assert unchanged.keys() == kept and all(unchanged[k] is stock[cls][k] for k in unchanged)
    yolo_fastdetect.disable()
    reverted = class_dicts()
    for cls in PREDICTOR_CLASSES:
        assert reverted[cls].keys() == stock[cls].keys()
        assert all(reverted[cls][k] is stock[cls][k] for k in stock[cls])
    assert SegmentationPredictor.preprocess is BasePredictor.preprocess


def test_enable_disable_round_trip():
    assert predictor_patch.PATCH in patches.PATCHES
    assert yolo_fastdetect.is_enabled() and predictor_patch.is_applied()
    yolo_fastdetect.disable()
    yolo_fastdetect.disable()  # idempotent
    assert not predictor_patch.is_applied() and not yolo_fastdetect.is_enabled()
    assert DetectionPredictor.inference is BasePredictor.inference
    assert engine_predictor.attempt_compile is torch_utils.attempt_compile
    yolo_fastdetect.enable()
    yolo_fastdetect.enable()
    assert predictor_patch.is_applied() and yolo_fastdetect.is_enabled()
    assert SegmentationPredictor.inference is predictor_patch.inference
    assert engine_predictor.attempt_compile is predictor_patch.attempt_compile


def test_cpu_runs_the_stock_paths(monkeypatch):
    """On the CPU neither the letterbox operator nor the graph cache is touched: results are bit-identical to the
    stock predictor's (the decode and NMS patches on in both runs; they are compared with stock elsewhere)."""
    model = detecting_model("cpu")
    sources = [*asset_arrays(), *asset_images()]
    predictor_patch.revert()
    stock = model.predict(sources, imgsz=320, device="cpu", verbose=False)
    predictor_patch.apply()

    def forbidden(*args, **kwargs):
        raise AssertionError("a CUDA-only path ran on the CPU")

    monkeypatch.setattr(predictor_patch, "letterbox", forbidden)
    monkeypatch.setattr(predictor_patch, "default_cache", forbidden)
    monkeypatch.setattr(postprocess_patch, "_cache", forbidden)
    ours = model.predict(sources, imgsz=320, device="cpu", verbose=False)
    assert sum(len(r.boxes) for r in stock) > 0, "the seeded model should detect something"
    for stock_result, our_result in zip(stock, ours):
        assert torch.equal(our_result.boxes.data, stock_result.boxes.data)


@pytest.mark.parametrize("rect", [True, False])
@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("imgsz", [640, 320, (384, 640)])
def test_letterbox_options_reproduce_stock_preprocess(rect, fp16, imgsz):
    """The operator with the arguments the patch derives (auto from rect and same shapes, imgsz, stride, dtype)
    gives stock pre_transform + preprocess bit for bit; run on the CPU, where the operator is CPU-verified."""
    predictor = set_up_predictor(detecting_model("cpu"), "cpu", imgsz=imgsz, rect=rect)
    predictor.model.backend.fp16 = fp16  # AutoBackend keeps fp16 off on the CPU; the dtype logic is what is tested
    bus, zidane = asset_arrays()
    for images in ([bus], [zidane], [bus, zidane], [zidane, zidane, zidane], [bus, zidane[:, :777]]):
        options = predictor_patch.letterbox_options(predictor, images)
        assert options is not None
        assert options["auto"] == (rect and len({i.shape for i in images}) == 1)
        ours = letterbox(images, device="cpu", **options)[0]
        stock = BasePredictor.preprocess(predictor, images)
        assert ours.dtype == stock.dtype == (torch.float16 if fp16 else torch.float32)
        assert torch.equal(ours, stock)


def test_letterbox_options_decline_what_stock_does_differently():
    predictor = set_up_predictor(detecting_model("cpu"), "cpu")
    bus = asset_arrays()[0]
    assert predictor_patch.letterbox_options(predictor, [bus]) is not None
    declined = [
        [bus[..., 0]],  # grayscale
        [np.dstack([bus, bus[..., :1]])],  # 4 channels
        [bus.astype(np.float32)],
        torch.from_numpy(bus),  # tensors are already preprocessed by the caller
        [],
    ]
    for images in declined:
        assert predictor_patch.letterbox_options(predictor, images) is None
    predictor.scale_fill = True
    assert predictor_patch.letterbox_options(predictor, [bus]) is None
    predictor.scale_fill = False
    predictor.pre_transform = lambda images: images  # a custom pre_transform
    assert predictor_patch.letterbox_options(predictor, [bus]) is None


@pytest.mark.parametrize("device", devices())
def test_a_batch_of_a_mixed_list_is_letterboxed_as_stock_letterboxes_the_whole_list(device, monkeypatch):
    """An ImageBatch from a list of mixed sizes (``mixed_shapes``) takes the letterbox stock gives its whole list (no
    minimal padding) even where the batch has one shape, on the GPU letterbox and on stock's path, and leaves
    ``rect`` as it was; a batch of one shape otherwise pads minimally, as stock does."""
    predictor = set_up_predictor(detecting_model(device), device, imgsz=320)
    bus, zidane = asset_arrays()
    ran = []
    monkeypatch.setattr(predictor_patch, "letterbox", lambda *a, **k: ran.append(1) or letterbox(*a, **k))
    whole_list = BasePredictor.preprocess(predictor, [zidane, zidane, bus])
    ours = predictor.preprocess(ImageBatch([zidane, zidane], mixed_shapes=True))
    assert predictor.args.rect and ours.shape[2:] == (320, 320) and torch.equal(ours, whole_list[:2])
    one_shape = predictor.preprocess(ImageBatch([zidane, zidane]))
    assert one_shape.shape[2:] != (320, 320)
    assert torch.equal(one_shape, BasePredictor.preprocess(predictor, [zidane, zidane]))
    assert len(ran) == (2 if device == "cuda" else 0)


# CUDA ------------------------------------------------------------------------------------------------------------

GPU_MODELS = ["yolo11n.yaml", "yolov8n.yaml", "yolo12n.yaml"]


def predict(model, sources, runs: int = 3, new_predictor: bool = True, **kwargs) -> list:
    """The results of the last of ``runs`` identical predictions, on a new predictor (``new_predictor``) as a user's
    first call makes, so that nothing of the other side's predictor is reused: by the third a shape's graph is
    replayed."""
    if new_predictor:
        model.predictor = None
    for _ in range(runs):
        results = model.predict(sources, device="cuda", verbose=False, **kwargs)
    return results


def sources_for(kind: str) -> list:
    bus, zidane = asset_arrays()
    return {
        "single": [bus],  # batch 1, letterboxed to a rectangle (rect)
        "mixed": [bus, zidane, zidane, bus, zidane],  # several sizes: 640x640
        "same": [zidane] * 3,  # one size: a rectangle again
        "paths": asset_images() * 2,
    }[kind]


def assert_same_detections(ours: list, stock: list, box_atol: float, conf_atol: float) -> None:
    """Per image as many boxes, and each of ours within ``box_atol`` px of a stock box of its class whose confidence
    is within ``conf_atol``."""
    difference = detection_difference(ours, stock, conf_atol)
    assert difference["stock"] > 0, "the seeded model should detect something"
    assert difference["same_counts"], difference
    assert difference["max_box_diff_px"] <= box_atol, difference


@pytest.fixture
def letterbox_calls(monkeypatch):
    """Counts the predictor's letterbox calls; starts with an empty graph cache."""
    default_cache().clear()
    calls = []
    monkeypatch.setattr(predictor_patch, "letterbox", lambda *a, **k: calls.append(1) or letterbox(*a, **k))
    return calls


@pytest.mark.cuda
@pytest.mark.parametrize("config", GPU_MODELS)
@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind", ["single", "mixed", "same", "paths"])
def test_predict_same_as_without_the_predictor_patch(config, half, kind, letterbox_calls):
    """The predictor patch alone (decode and NMS patched on both sides): GPU letterbox + graph replay give the eager
    run's detections exactly (same input bits, same kernels)."""
    model = detecting_model("cuda", config)
    predictor_patch.revert()
    eager = predict(model, sources_for(kind), half=half, batch=8)
    predictor_patch.apply()
    ours = predict(model, sources_for(kind), half=half, batch=8)
    assert letterbox_calls, "the letterbox operator did not run"
    assert len(default_cache()) >= 1, "no graph was captured"
    assert_same_detections(ours, eager, box_atol=1e-3, conf_atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("config", GPU_MODELS)
@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_predict_same_as_stock(config, half, monkeypatch):
    """Everything on against stock (disabled()). fp32 with TF32 off, as stock's TF32 DFL is off by up to 0.16 px.
    In fp16 both decodes round box coordinates to fp16, 0.5 px steps at 512-1024 px of the input, up to 2x that in
    the original image: boxes may differ by two such steps."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    model = detecting_model("cuda", config)
    for kind in ("single", "mixed"):
        with yolo_fastdetect.disabled():
            stock = predict(model, sources_for(kind), half=half, batch=8)
        ours = predict(model, sources_for(kind), half=half, batch=8)
        assert_same_detections(ours, stock, box_atol=2.0 if half else 1e-3, conf_atol=2e-3 if half else 1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("rect", [True, False])
def test_preprocess_bit_identical_on_cuda(half, rect, letterbox_calls):
    predictor = set_up_predictor(detecting_model("cuda"), "cuda", half=half, rect=rect)
    letterbox_calls.clear()
    for images in (sources_for("single"), sources_for("mixed"), sources_for("same")):
        ours = predictor.preprocess(images)
        stock = BasePredictor.preprocess(predictor, images)
        assert ours.device == stock.device and ours.dtype == stock.dtype
        assert torch.equal(ours, stock)
    assert len(letterbox_calls) == 3


@pytest.mark.cuda
def test_graph_replay_equals_eager_forward():
    """predictor.inference from a graph against the AutoBackend forward pass on the same input, outputs nested as
    the model returns them (Detect: [y, {boxes, scores, feats}])."""
    predictor = set_up_predictor(detecting_model("cuda", "yolo11n.yaml"), "cuda")
    default_cache().clear()
    with torch.inference_mode():
        inputs = [torch.rand(2, 3, 480, 640, device="cuda") for _ in range(3)]
        for x in inputs:
            replayed = predictor.inference(x)
            expected = predictor.model(x)
            assert isinstance(replayed, list) and isinstance(replayed[1], dict)
            torch.testing.assert_close(replayed, expected)  # the whole nested structure, fp32 tolerances
    assert len(default_cache()) == 1


@pytest.mark.cuda
def test_graphs_off_by_environment(monkeypatch, letterbox_calls):
    monkeypatch.setenv(predictor_patch.GRAPHS_VARIABLE, "0")
    model = detecting_model("cuda")
    ours = predict(model, sources_for("single"))
    assert len(default_cache()) == 0
    assert letterbox_calls  # the letterbox operator still runs
    predictor_patch.revert()
    assert_same_detections(ours, predict(model, sources_for("single")), box_atol=1e-3, conf_atol=1e-4)


@pytest.mark.cuda
def test_cache_size_limit(monkeypatch, letterbox_calls):
    """bus and zidane alone are letterboxed to two rectangles: with room for one graph, one is kept."""
    monkeypatch.setenv("YOLO_FASTDETECT_GRAPH_CACHE", "1")
    model = detecting_model("cuda")
    bus, zidane = asset_arrays()
    results = [model.predict([image], device="cuda", verbose=False)[0] for image in (bus, zidane) * 4]
    assert len(default_cache()) == 1
    predictor_patch.revert()
    stock = [model.predict([image], device="cuda", verbose=False)[0] for image in (bus, zidane)]
    assert_same_detections(results[-2:], stock, box_atol=1e-3, conf_atol=1e-4)


@pytest.mark.cuda
def test_segment_predictor(letterbox_calls):
    model = detecting_model("cuda", "yolo11n-seg.yaml")
    predictor_patch.revert()
    eager = predict(model, sources_for("mixed"), batch=8)
    predictor_patch.apply()
    ours = predict(model, sources_for("mixed"), batch=8)
    assert len(default_cache()) == 1 and letterbox_calls
    assert_same_detections(ours, eager, box_atol=1e-3, conf_atol=1e-4)
    for our_result, eager_result in zip(ours, eager):
        assert (our_result.masks is None) == (eager_result.masks is None)
        if our_result.masks is not None:
            assert our_result.masks.data.shape == eager_result.masks.data.shape
            assert (our_result.masks.data != eager_result.masks.data).float().mean() < 1e-3


@pytest.mark.cuda
def test_uncapturable_model_falls_back_silently(letterbox_calls, recwarn):
    """A dynamic head rebuilds its anchors on every call, copying from the host: the capture fails, the model runs
    eagerly, and predictions are stock's, with no warning or error."""
    model = detecting_model("cuda")
    model.model.model[-1].dynamic = True
    ours = predict(model, sources_for("single"), runs=4)
    assert len(default_cache()) == 0
    assert not [w for w in recwarn if "yolo_fastdetect" in str(w.message)]
    predictor_patch.revert()
    assert_same_detections(ours, predict(model, sources_for("single")), box_atol=1e-3, conf_atol=1e-4)
    predictor_patch.apply()
    other = predict(detecting_model("cuda"), sources_for("single"))  # a later capture still works
    assert len(default_cache()) == 1 and len(other[0].boxes) > 0


@pytest.mark.cuda
def test_head_hooks_run_eager(letterbox_calls):
    """capture_head_inputs hooks the head: predictions run eagerly, so the hook sees every batch."""
    model = detecting_model("cuda")
    capture = yolo_fastdetect.capture_head_inputs(model)
    for image in asset_arrays() * 2:  # two input shapes, alternating: a missed hook would leave the other's maps
        results = model.predict([image], device="cuda", verbose=False)
        assert capture.input_shape == letterbox_geometry(image.shape, 640, auto=True).shape
    assert len(default_cache()) == 0
    features = yolo_fastdetect.roi_features(model, results)
    assert features[0].shape[0] == len(results[0].boxes)


@pytest.mark.cuda
def test_end_to_end_head_settings_are_part_of_the_key(letterbox_calls):
    """An NMS-free head reads max_det (set by each predict run, at least 300) in its forward pass: a graph captured
    with 300 must not answer a run with 400."""
    model = detecting_model("cuda", "yolo26n.yaml")
    for branch in model.model.model[-1].one2one_cv3:  # raise the one-to-one branch's person/bus biases too
        bias = torch.full_like(branch[-1].bias, -6.0)
        bias[[0, 5]] = 1.0
        branch[-1].bias.data.copy_(bias)
    # One predictor throughout (max_det is not a setup argument): its graphs, then its eager forward.
    ours = {max_det: predict(model, sources_for("single"), new_predictor=False, nms=False, max_det=max_det)
            for max_det in (300, 400)}
    assert len(default_cache()) == 2
    predictor_patch.revert()
    for max_det, results in ours.items():
        assert len(results[0].boxes) == max_det  # the seeded model has more candidates than that
        eager = predict(model, sources_for("single"), runs=1, new_predictor=False, nms=False, max_det=max_det)
        assert_same_detections(results, eager, box_atol=1e-3, conf_atol=1e-4)


@pytest.mark.cuda
def test_augment_runs_eager(letterbox_calls):
    model = detecting_model("cuda")
    predict(model, sources_for("single"), augment=True)
    assert len(default_cache()) == 0 and letterbox_calls


@pytest.mark.cuda
def test_pose_graphs_keep_their_anchors(letterbox_calls):
    """Pose decodes keypoints with the head's anchors inside the graph. Alternating two input shapes, each eager
    call on one shape replaces the anchors the other shape's graph reads: the graph must keep them alive."""
    model = detecting_model("cuda", "yolo11n-pose.yaml")
    bus, zidane = asset_arrays()
    ours = [model.predict([image], device="cuda", verbose=False)[0] for image in (bus, zidane) * 4]
    assert len(default_cache()) == 2
    predictor_patch.revert()
    eager = [model.predict([image], device="cuda", verbose=False)[0] for image in (bus, zidane)]
    assert_same_detections(ours[-2:], eager, box_atol=1e-3, conf_atol=1e-4)
    for our_result, eager_result in zip(ours[-2:], eager):
        torch.testing.assert_close(our_result.keypoints.data, eager_result.keypoints.data, rtol=0, atol=1e-3)
