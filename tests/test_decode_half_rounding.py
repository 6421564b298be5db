"""float16/bfloat16 decode rounded as stock rounds: the operator against stock Ultralytics' own ops.

Stock materialises every step of its half decode in the features' dtype (DFL softmax, the DFL conv over the bins,
anchors, ``x1y1``/``x2y2``, centre and size, the stride scale, the class sigmoid); each PyTorch op computes in float
and rounds its output to the dtype. The operator rounds at the same points, so its scores equal stock's bit for bit
and its boxes nearly all do. The residue: the DFL's two float sums (the softmax's denominator, the conv's sum of
``k * p_k``) add in the order of stock's kernels, which the operator cannot know for the conv, and on the CPU ATen's
vectorised softmax takes its exp from SLEEF where the operator calls libm; a float one ulp apart rounds to another
half value when it lies on a rounding boundary. Measured: about 1e-5 of the boxes, each one ulp of a DFL distance.

One stock quirk on the CPU: ``softmax`` over a reduced-float tensor (ATen's ``_vec_softmax``) runs its scalar tail
(positions past the last full vector of each image's flattened ``(side, anchor)`` row, at most 31) with the exp
rounded to the dtype before the division, unlike its vector body, CUDA and the operator. Those anchors (the last
``4A mod 32`` of the bottom side) are left out of the CPU comparison; stock runs single-threaded there, so that no
thread's chunk ends elsewhere in a row.
"""

from __future__ import annotations

import pytest
import torch
from ultralytics.nn.modules.head import Detect
from ultralytics.utils.nms import non_max_suppression

import yolo_fastdetect
from conftest import assert_same_results_bitwise, asset_images, detecting_model, devices
from test_detect_decode import HALF_DTYPES, LAYOUTS, assert_rounded_alike, random_head_outputs
from yolo_fastdetect.patches import detect_head

# 480x640 is the letterboxed bus.jpg; 2048x64 has a 256-cell-wide P3, whose bfloat16 anchor centres round.
HALF_LAYOUTS = {**{name: LAYOUTS[name] for name in ("480x640", "640x640")},
                "2048x64": ([(8, 256), (4, 128), (2, 64)], [8, 16, 32])}
STOCK_CPU_SOFTMAX_VECTOR = 32  # halves per vector of ATen's AVX-512 softmax (16 with AVX2)


def decode_stock_and_ours(head: Detect, x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``head._inference(x)`` by stock and by the patch (which must take its fused path)."""
    assert detect_head._fast_path_applies(head, x)
    threads = torch.get_num_threads()
    with torch.inference_mode(), yolo_fastdetect.disabled():
        head.shape = None
        torch.set_num_threads(1)  # see the module docstring
        try:
            stock = head._inference(x)
        finally:
            torch.set_num_threads(threads)
    with torch.inference_mode():
        head.shape = None
        ours = head._inference(x)
    return stock, ours


def assert_rounded_as_stock(ours: torch.Tensor, stock: torch.Tensor, head: Detect) -> None:
    """``assert_rounded_alike``; on the CPU without stock's softmax tail (module docstring)."""
    num_anchors = ours.shape[2]
    compared = num_anchors - 4 * num_anchors % STOCK_CPU_SOFTMAX_VECTOR if ours.device.type == "cpu" else None
    assert_rounded_alike(ours, stock, float(head.stride.max()), head.reg_max, compared)


def assert_same_detections(ours: torch.Tensor, stock: torch.Tensor, head: Detect, dtype: torch.dtype) -> None:
    """NMS output ``(n, 6)``: the same count, classes and scores; boxes within two distance ulps (x1 = cx - w / 2 of
    a box whose centre and size each moved by one)."""
    assert len(stock) > 0 and len(ours) == len(stock)
    assert torch.equal(ours[:, 4:], stock[:, 4:])
    atol = 4 * torch.finfo(dtype).eps * head.reg_max * float(head.stride.max())
    torch.testing.assert_close(ours[:, :4], stock[:, :4], rtol=0, atol=atol)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(HALF_LAYOUTS))
@pytest.mark.parametrize("reg_max", [16, 1])
def test_operator_equals_stock_ops(generator, device, dtype, layout, reg_max):
    level_shapes, level_strides = HALF_LAYOUTS[layout]
    head = Detect(nc=80, reg_max=reg_max, ch=(16, 16, 16)).eval().to(device, dtype)  # only its decode runs
    head.stride = torch.tensor(level_strides, dtype=torch.float32)
    boxes, scores = random_head_outputs(generator, 8, 80, level_shapes, reg_max, dtype, device)
    feats = [torch.empty(8, 1, h, w, device=device, dtype=dtype) for h, w in level_shapes]  # shapes only
    stock, ours = decode_stock_and_ours(head, {"boxes": boxes, "scores": scores, "feats": feats})
    assert_rounded_as_stock(ours, stock, head)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_sigmoid_of_every_value(device, dtype):
    """Every finite value of the dtype as a class logit: the operator's score is stock's ``sigmoid``, bit for bit."""
    values = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
    values = values[torch.isfinite(values)].to(device)
    scores = values.view(1, -1, 256)  # both dtypes have a multiple of 256 finite values
    boxes = torch.zeros(1, 64, 256, device=device, dtype=dtype)
    out = yolo_fastdetect.detect_decode(boxes, scores, [(16, 16)], [8])
    assert torch.equal(out[:, 4:], scores.sigmoid())


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_seeded_model_head_cpu(generator, dtype):
    """The seeded YAML model's head in half on the CPU (AutoBackend keeps CPU predictions in float32, and a random
    backbone's features fade to zero, so the head runs on random features of unit scale, its box convolution scaled
    for logits spread as a trained head's): stock's and the patched head give the same tensor, and NMS at conf 0.001
    the same detections."""
    head = detecting_model("cpu", "yolov8n.yaml").model.model[-1].eval()
    for branch in head.cv2:
        branch[-1].weight.data.mul_(50)
    head.to(dtype)
    channels = [branch[0].conv.in_channels for branch in head.cv2]
    level_shapes, _ = LAYOUTS["480x640"]
    feats = [torch.randn(2, c, h, w, generator=generator).to(dtype) for c, (h, w) in zip(channels, level_shapes)]
    with torch.inference_mode():
        x = head.forward_head(feats, **head.one2many)
    stock, ours = decode_stock_and_ours(head, x)
    assert_rounded_as_stock(ours, stock, head)
    # no time limit: past it (4 s on a busy CPU) stock's NMS drops the images left
    detections = [non_max_suppression(y, 0.001, max_time_img=1e3) for y in (ours, stock)]
    for our_image, stock_image in zip(*detections):
        assert_same_detections(our_image, stock_image, head, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", ["yolov8s.yaml", "yolo11n.yaml", "yolo26n.yaml"])
def test_predict_half_cuda(cfg):
    """model.predict(half=True) on the GPU: the patched decode (stock's DFL module, then the operator's rounding) gives
    stock's detections at conf 0.001 bit for bit."""
    model = detecting_model("cuda", cfg)
    results = {}
    for patched in (False, True):
        (yolo_fastdetect.enable if patched else yolo_fastdetect.disable)()
        try:
            results[patched] = model.predict(asset_images(), half=True, conf=0.001, device=0, verbose=False)
        finally:
            yolo_fastdetect.enable()
    assert_same_results_bitwise(results[True], results[False])
