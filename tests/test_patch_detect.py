"""The patched Ultralytics Detect head against stock Ultralytics on the same weights."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from ultralytics import YOLO
from ultralytics.nn.modules.head import OBB, Detect
from ultralytics.utils import ASSETS

import yolo_fastdetect
from conftest import asset_images, detecting_model, subprocess_env, write_tiny_dataset
from yolo_fastdetect.bench._timing import detecting_model as seeded_model
from yolo_fastdetect.patches import detect_head

# One size per family runs everywhere; the other YOLO12 sizes are in the slow set (GPU runs and --runslow).
MODELS = ["yolo12n.yaml", "yolov8n.yaml", "yolo11n.yaml", "yolo26n.yaml", "yolo11n-seg.yaml", "yolo11n-pose.yaml"]
SLOW_MODELS = ["yolo12s.yaml", "yolo12m.yaml", "yolo12l.yaml", "yolo12x.yaml"]
INPUT_SIZES = [(640, 640), (480, 640), (320, 256)]


def build_model(cfg: str, seed: int = 0) -> YOLO:
    """A YAML model with seeded random weights, every class bias raised so that it outputs boxes, in eval mode."""
    return seeded_model(cfg, raised=None, seed=seed).eval()


def head_inputs(model: YOLO, images: torch.Tensor) -> tuple[Detect, list[torch.Tensor]]:
    """Run the backbone once and capture the P3/P4/P5 maps the head receives."""
    network = model.model.eval()
    head = network.model[-1]
    captured = []
    hook = head.register_forward_pre_hook(lambda module, args: captured.append([t.clone() for t in args[0]]))
    with torch.inference_mode():
        network(images)
    hook.remove()
    return head, captured[0]


def raw_preds(head: Detect, feats: list[torch.Tensor]) -> dict:
    """The head's raw one-to-many prediction dict, as its forward passes it to _inference."""
    with torch.inference_mode():
        return head.forward_head(feats, **head.one2many)


def run_head(head: Detect, feats: list[torch.Tensor], patched: bool):
    (yolo_fastdetect.enable if patched else yolo_fastdetect.disable)()
    head.shape = None  # rebuild anchors as a fresh model would
    with torch.inference_mode():
        out = head([f.clone() for f in feats])
    state = (head.anchors.clone(), head.strides.clone(), head.shape)
    return out, state


def first_tensor(out):
    """The decoded prediction tensor y of a head's eval output (Segment/Pose nest it)."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


@pytest.fixture(autouse=True)
def restore_patch():
    yield
    yolo_fastdetect.enable()


def assert_head_parity(cfg: str, batch: int, size: tuple[int, int], device: str, dtype: torch.dtype):
    model = build_model(cfg)
    model.model.to(device, dtype)
    images = torch.rand(batch, 3, *size, device=device, dtype=dtype)
    head, feats = head_inputs(model, images)
    assert detect_head._fast_path_applies(head, raw_preds(head, feats))
    stock, stock_state = run_head(head, feats, patched=False)
    ours, our_state = run_head(head, feats, patched=True)
    y_stock, y_ours = first_tensor(stock), first_tensor(ours)
    assert y_ours.shape == y_stock.shape and y_ours.dtype == y_stock.dtype
    nc = head.nc
    torch.testing.assert_close(y_ours[:, :4], y_stock[:, :4], rtol=0, atol=1e-4)
    torch.testing.assert_close(y_ours[:, 4 : 4 + nc], y_stock[:, 4 : 4 + nc], rtol=0, atol=1e-6)
    # Segment mask coefficients and Pose keypoints are stock code on both sides: identical.
    torch.testing.assert_close(y_ours[:, 4 + nc :], y_stock[:, 4 + nc :], rtol=0, atol=0)
    for ours_part, stock_part in zip(our_state, stock_state):
        assert (ours_part == stock_part).all() if isinstance(ours_part, torch.Tensor) else ours_part == stock_part


@pytest.mark.parametrize("cfg", MODELS)
@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("size", INPUT_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_head_parity_cpu(cfg, batch, size):
    assert_head_parity(cfg, batch, size, "cpu", torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", SLOW_MODELS)
def test_head_parity_cpu_sizes(cfg):
    assert_head_parity(cfg, 1, (480, 640), "cpu", torch.float32)


def test_export_mode_and_autograd_run_stock():
    model = build_model("yolo12n.yaml")
    head, feats = head_inputs(model, torch.rand(1, 3, 320, 256))
    preds = raw_preds(head, feats)
    head.export = True
    assert not detect_head._fast_path_applies(head, preds)
    head.export = False
    needs_grad = {**preds, "boxes": preds["boxes"].clone().requires_grad_(), "feats": [f.clone() for f in feats]}
    assert not detect_head._fast_path_applies(head, needs_grad)
    head.shape = None  # the anchors cached under inference_mode cannot enter an autograd graph
    y = head._inference(needs_grad)
    assert y.requires_grad  # stock decode kept the graph


def test_obb_runs_stock():
    model = build_model("yolo11n-obb.yaml")
    head, feats = head_inputs(model, torch.rand(2, 3, 320, 256))
    assert isinstance(head, OBB)
    assert not detect_head._fast_path_applies(head, raw_preds(head, feats))
    stock, _ = run_head(head, feats, patched=False)
    ours, _ = run_head(head, feats, patched=True)
    torch.testing.assert_close(first_tensor(ours), first_tensor(stock), rtol=0, atol=0)


def test_xyxy_and_end2end_heads():
    model = build_model("yolo26n.yaml")
    head, feats = head_inputs(model, torch.rand(2, 3, 480, 640))
    head.xyxy = True
    stock, _ = run_head(head, feats, patched=False)
    ours, _ = run_head(head, feats, patched=True)
    torch.testing.assert_close(first_tensor(ours), first_tensor(stock), rtol=0, atol=1e-4)
    head.xyxy = False
    head.end2end = True  # NMS-free branch: decoded xyxy, then top-k postprocess to (B, max_det, 6)
    stock, _ = run_head(head, feats, patched=False)
    ours, _ = run_head(head, feats, patched=True)
    assert first_tensor(ours).shape == (2, 300, 6)
    torch.testing.assert_close(first_tensor(ours), first_tensor(stock), rtol=0, atol=1e-4)


@pytest.mark.parametrize("cfg", ["yolo12n.yaml", "yolo11n-seg.yaml"])
def test_predict_same_detections(cfg):
    """model.predict on the wheel's images (AutoBackend fuses the model) gives stock's boxes, classes, scores."""
    model = build_model(cfg, seed=1)
    sources = [str(ASSETS / "bus.jpg"), str(ASSETS / "zidane.jpg")]
    results = {}
    for patched in (False, True):
        (yolo_fastdetect.enable if patched else yolo_fastdetect.disable)()
        results[patched] = model.predict(sources, imgsz=320, conf=0.25, verbose=False)
    for stock, ours in zip(results[False], results[True]):
        assert len(stock.boxes) > 0, "the seeded model should detect something"
        torch.testing.assert_close(ours.boxes.data, stock.boxes.data, rtol=0, atol=1e-3)


def test_val_same_metrics(tmp_path):
    """model.val with everything on (decode and NMS patched) gives the stock metrics on a tiny labelled set."""
    model = detecting_model("cpu")
    data = write_tiny_dataset(tmp_path / "dataset", num_classes=80)
    metrics = {}
    for patched in (False, True):
        (yolo_fastdetect.enable if patched else yolo_fastdetect.disable)()
        result = model.val(data=str(data), imgsz=320, batch=2, device="cpu", conf=0.25, plots=False, workers=0,
                           verbose=False, project=str(tmp_path / "runs"), name=f"patched{patched}")
        metrics[patched] = result.results_dict
    assert metrics[True]["metrics/recall(B)"] > 0
    assert metrics[True] == metrics[False]


def test_track_same_boxes_and_ids(tmp_path):
    """model.track (ByteTrack over a short video of the wheel's images) gives stock's boxes and track ids."""
    pytest.importorskip("lap", reason="Ultralytics' tracker needs lap (in the dev extra)")
    import cv2

    video = tmp_path / "clip.mp4"
    frame = cv2.resize(cv2.imread(asset_images()[0]), (320, 416))
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10, (320, 416))
    for shift in range(6):  # the bus drifting right, so that tracks persist across frames
        writer.write(np.roll(frame, 4 * shift, axis=1))
    writer.release()
    tracks = {}
    for patched in (False, True):
        (yolo_fastdetect.enable if patched else yolo_fastdetect.disable)()
        model = detecting_model("cpu")  # a fresh tracker state per run
        results = model.track(str(video), imgsz=320, device="cpu", verbose=False, persist=False)
        tracks[patched] = [(r.boxes.data.clone(), r.boxes.id) for r in results]
    assert any(ids is not None for _, ids in tracks[True]), "the seeded model should track something"
    for (stock_boxes, stock_ids), (our_boxes, our_ids) in zip(tracks[False], tracks[True]):
        torch.testing.assert_close(our_boxes, stock_boxes, rtol=0, atol=1e-3)
        assert (stock_ids is None and our_ids is None) or torch.equal(stock_ids, our_ids)


def test_loaded_checkpoint(tmp_path):
    """A model saved and loaded back (pickled Detect class) decodes through the patch too."""
    model = build_model("yolo11n.yaml", seed=2)
    path = tmp_path / "model.pt"
    model.save(path)
    loaded = YOLO(path)
    head, feats = head_inputs(loaded, torch.rand(1, 3, 320, 256))
    assert detect_head._fast_path_applies(head, raw_preds(head, feats))
    stock, _ = run_head(head, feats, patched=False)
    ours, _ = run_head(head, feats, patched=True)
    torch.testing.assert_close(first_tensor(ours), first_tensor(stock), rtol=0, atol=1e-4)


def test_enable_disable_round_trip():
    original = detect_head.PATCH.original("_inference")
    assert yolo_fastdetect.is_enabled() and Detect.__dict__["_inference"] is detect_head.fast_inference
    yolo_fastdetect.disable()
    yolo_fastdetect.disable()  # idempotent
    assert not yolo_fastdetect.is_enabled() and Detect.__dict__["_inference"] is original
    yolo_fastdetect.enable()
    yolo_fastdetect.enable()
    assert yolo_fastdetect.is_enabled() and Detect.__dict__["_inference"] is detect_head.fast_inference
    yolo_fastdetect.disable()
    assert Detect.__dict__["_inference"] is original


def test_disabled_restores_the_state_before_it():
    original = detect_head.PATCH.original("_inference")
    assert yolo_fastdetect.is_enabled()
    with yolo_fastdetect.disabled():
        assert not yolo_fastdetect.is_enabled() and Detect.__dict__["_inference"] is original
    assert yolo_fastdetect.is_enabled() and Detect.__dict__["_inference"] is detect_head.fast_inference
    with pytest.raises(KeyError), yolo_fastdetect.disabled():  # restored on an exception too
        raise KeyError("in the block")
    assert yolo_fastdetect.is_enabled()
    yolo_fastdetect.disable()
    with yolo_fastdetect.disabled():
        yolo_fastdetect.enable()  # enabled inside a block entered disabled: disabled again after it
    assert not yolo_fastdetect.is_enabled() and Detect.__dict__["_inference"] is original
    with yolo_fastdetect.disabled(), yolo_fastdetect.disabled():  # nested
        assert not yolo_fastdetect.is_enabled()
    assert not yolo_fastdetect.is_enabled()


def test_opt_out_environment_variable():
    code = (
        "import yolo_fastdetect, sys; from ultralytics.nn.modules.head import Detect; "
        "assert not yolo_fastdetect.is_enabled(); "
        "assert 'yolo_fastdetect.patches' not in sys.modules; "
        "assert getattr(Detect._inference, '__yolo_fastdetect__', False) is False; print('stock')"
    )
    env = subprocess_env(YOLO_FASTDETECT="0")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "stock"


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", MODELS + SLOW_MODELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tf32", [True, False], ids=["tf32", "no-tf32"])
def test_head_cuda_equals_stock(cfg, dtype, tf32, monkeypatch):
    """On CUDA the patched head's output is stock's bit for bit, with cuDNN's TF32 on (torch's default) or off: the
    DFL's convolution is stock's own module, the rest of the decode rounds as stock's ops."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    model = build_model(cfg)
    model.model.to("cuda", dtype)
    for batch, size in ((1, (480, 640)), (5, (640, 640)), (16, (320, 256))):
        head, feats = head_inputs(model, torch.rand(batch, 3, *size, device="cuda", dtype=dtype))
        stock, _ = run_head(head, feats, patched=False)
        ours, _ = run_head(head, feats, patched=True)
        y_ours, y_stock = first_tensor(ours), first_tensor(stock)
        assert y_ours.dtype == y_stock.dtype == dtype
        assert torch.equal(y_ours, y_stock), (batch, size, (y_ours.double() - y_stock.double()).abs().max().item())
