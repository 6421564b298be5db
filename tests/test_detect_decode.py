"""The detect_decode operator against its float64 pure-PyTorch reference, on CPU and CUDA."""

from __future__ import annotations

import pytest
import torch

from conftest import devices
from yolo_fastdetect._ext import require
from yolo_fastdetect.ops import detect_decode, detect_decode_reference

# (level grid sizes, strides): 640x640, 480x640 (letterboxed bus.jpg), 320x256, four levels, one level.
LAYOUTS = {
    "640x640": ([(80, 80), (40, 40), (20, 20)], [8, 16, 32]),
    "480x640": ([(60, 80), (30, 40), (15, 20)], [8, 16, 32]),
    "320x256": ([(40, 32), (20, 16), (10, 8)], [8, 16, 32]),
    "p2-p5": ([(36, 20), (18, 10), (9, 5), (5, 3)], [4, 8, 16, 32]),
    "one-level": ([(7, 13)], [16]),
    "odd-anchors": ([(15, 21), (8, 11), (4, 6)], [8, 16, 32]),  # 427 anchors: the unvectorised CUDA path
}
# float32 against the float64 reference: its output rounding, ~1e-7 relative.
TOLERANCE_FLOAT32 = (2e-6, 1e-4)
# float16/bfloat16 round as stock's decode (test_decode_half_rounding): a box may differ from another such decode
# where a float sum or exp one ulp apart lands across a rounding boundary of the dtype; at most this fraction do,
# by device. On CUDA, stock's bin sum is cuDNN's half convolution, whose order is its own: the H200 measured 1.4e-4
# to 1.6e-4 of the boxes (RESULTS.md, Detect-head decode, "Half precision against stock"). On the CPU (SLEEF's exp in
# stock's softmax, libm's in the operator) 1.3e-5 on one host, and up to 1.4e-4 on an AMD EPYC (AVX-512) host over
# 30 seeds of test_decode_half_rounding, where 1e-4 failed one seed in four.
RESIDUE = {"cpu": 3e-4, "cuda": 3e-4}
HALF_DTYPES = (torch.float16, torch.bfloat16)


def random_head_outputs(generator, batch, num_classes, level_shapes, reg_max, dtype, device):
    """Logits on the scale a trained head produces (box bins spread over a few units, scores around zero)."""
    num_anchors = sum(h * w for h, w in level_shapes)
    boxes = torch.randn(batch, 4 * reg_max, num_anchors, generator=generator) * 3
    if reg_max == 1:
        boxes = boxes.abs()  # YOLO26 regresses non-negative distances in grid units
    scores = torch.randn(batch, num_classes, num_anchors, generator=generator) * 4 - 2
    return boxes.to(device, dtype), scores.to(device, dtype)


def assert_rounded_alike(out, expected, max_stride, reg_max, compared_anchors=None):
    """Two float16/bfloat16 decodes ``(B, 4 + nc, A)`` rounded as stock rounds: scores bit for bit; boxes (of the first
    ``compared_anchors``) bit for bit but for at most ``RESIDUE`` of them on ``out``'s device (one box at least), each
    moved by one ulp of its DFL distance at most: two ulps of the dtype at the larger of the coordinate and the
    longest distance in pixels."""
    residue = RESIDUE[out.device.type]
    out, expected = out.cpu(), expected.cpu()
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert torch.equal(out[:, 4:], expected[:, 4:]), "class scores differ"
    boxes_out, boxes_expected = out[:, :4, :compared_anchors].float(), expected[:, :4, :compared_anchors].float()
    error = (boxes_out - boxes_expected).abs()
    differing = (error > 0).any(1)
    report = f"{differing.sum().item()} of {differing.numel()} boxes differ, by up to {error.max().item():.3g} px"
    print(report)  # the residue, with pytest -s or -rP
    assert differing.sum().item() <= max(1.0, residue * differing.numel()), report
    scale = boxes_expected.abs().clamp(min=reg_max * max_stride)
    assert (error <= 2 * torch.finfo(out.dtype).eps * torch.exp2(torch.floor(torch.log2(scale)))).all(), report


def assert_matches_reference(out, boxes, scores, level_shapes, level_strides, reg_max, xywh):
    """float32 against the float64 reference; float16/bfloat16 against the reference in their dtype, which rounds as
    stock does."""
    assert out.dtype == boxes.dtype
    if boxes.dtype in HALF_DTYPES:
        reference = detect_decode_reference(boxes, scores, level_shapes, level_strides, reg_max, xywh)
        assert_rounded_alike(out, reference, max(level_strides), reg_max)
        return
    reference = detect_decode_reference(boxes.double(), scores.double(), level_shapes, level_strides, reg_max, xywh)
    rtol, atol = TOLERANCE_FLOAT32
    assert out.shape == reference.shape
    torch.testing.assert_close(out[:, :4].double().cpu(), reference[:, :4].cpu(), rtol=rtol, atol=atol)
    torch.testing.assert_close(out[:, 4:].double().cpu(), reference[:, 4:].cpu(), rtol=rtol, atol=max(atol, 1e-6))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("reg_max", [16, 1])
def test_matches_reference(generator, device, dtype, layout, reg_max):
    level_shapes, level_strides = LAYOUTS[layout]
    batch = int(torch.randint(1, 6, (1,), generator=generator))
    num_classes = int(torch.randint(1, 90, (1,), generator=generator))
    boxes, scores = random_head_outputs(generator, batch, num_classes, level_shapes, reg_max, dtype, device)
    out = detect_decode(boxes, scores, level_shapes, level_strides, reg_max)
    assert_matches_reference(out, boxes, scores, level_shapes, level_strides, reg_max, xywh=True)


@pytest.mark.parametrize("device", devices())
def test_xyxy(generator, device):
    level_shapes, level_strides = LAYOUTS["480x640"]
    boxes, scores = random_head_outputs(generator, 2, 80, level_shapes, 16, torch.float32, device)
    out = detect_decode(boxes, scores, level_shapes, level_strides, xywh=False)
    assert_matches_reference(out, boxes, scores, level_shapes, level_strides, 16, xywh=False)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_non_contiguous_inputs(generator, device, dtype):
    """Anchor-major storage (as a channels-last head would give) and a channel slice of a wider tensor."""
    level_shapes, level_strides = LAYOUTS["320x256"]
    boxes, scores = random_head_outputs(generator, 3, 20, level_shapes, 16, dtype, device)
    boxes_anchor_major = boxes.transpose(1, 2).contiguous().transpose(1, 2)
    scores_sliced = torch.cat((scores, scores), 1)[:, 20:]
    assert not boxes_anchor_major.is_contiguous() and not scores_sliced.is_contiguous()
    out = detect_decode(boxes_anchor_major, scores_sliced, level_shapes, level_strides)
    torch.testing.assert_close(out, detect_decode(boxes, scores, level_shapes, level_strides), rtol=0, atol=0)
    assert_matches_reference(out, boxes, scores, level_shapes, level_strides, 16, xywh=True)


@pytest.mark.parametrize("device", devices())
def test_empty_batch(device):
    level_shapes, level_strides = LAYOUTS["one-level"]
    boxes = torch.randn(0, 64, 91, device=device)
    out = detect_decode(boxes, torch.randn(0, 5, 91, device=device), level_shapes, level_strides)
    assert out.shape == (0, 9, 91)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_equals_cpu(generator, dtype):
    level_shapes, level_strides = LAYOUTS["480x640"]
    boxes, scores = random_head_outputs(generator, 4, 80, level_shapes, 16, dtype, "cpu")
    out_cpu = detect_decode(boxes, scores, level_shapes, level_strides)
    out_cuda = detect_decode(boxes.cuda(), scores.cuda(), level_shapes, level_strides)
    if dtype in HALF_DTYPES:
        # Each device rounds as its own stock ops do (test_decode_half_rounding), and stock's float sigmoid differs
        # between them by a float ulp now and then (CUDA's expf, the CPU's libm exp): one score in 21504 crossed a
        # float16 rounding boundary on the H200. Across devices the scores agree to one ulp of the dtype.
        info = torch.finfo(dtype)
        scores_cuda, scores_cpu = out_cuda[:, 4:].cpu(), out_cpu[:, 4:]
        torch.testing.assert_close(scores_cuda, scores_cpu, rtol=info.eps, atol=info.smallest_normal * info.eps)
        assert_rounded_alike(out_cuda, torch.cat((out_cpu[:, :4], out_cuda[:, 4:].cpu()), 1), max(level_strides), 16)
    else:
        torch.testing.assert_close(out_cuda.cpu(), out_cpu, rtol=TOLERANCE_FLOAT32[0], atol=TOLERANCE_FLOAT32[1])


@pytest.mark.parametrize("device", devices())
def test_opcheck(generator, device):
    level_shapes, level_strides = LAYOUTS["320x256"]
    boxes, scores = random_head_outputs(generator, 2, 7, level_shapes, 16, torch.float32, device)
    flat_shapes = [size for shape in level_shapes for size in shape]
    torch.library.opcheck(
        torch.ops.yolo_fastdetect.detect_decode.default,
        (boxes, scores, flat_shapes, [float(s) for s in level_strides], 16, True),
    )


def test_torch_compile_fullgraph(generator):
    level_shapes, level_strides = LAYOUTS["320x256"]
    boxes, scores = random_head_outputs(generator, 2, 7, level_shapes, 16, torch.float32, "cpu")
    compiled = torch.compile(lambda b, s: detect_decode(b, s, level_shapes, level_strides) * 2, fullgraph=True,
                             backend="aot_eager")
    torch.testing.assert_close(compiled(boxes, scores), detect_decode(boxes, scores, level_shapes, level_strides) * 2)


def test_torch_compile_dynamic_shapes(generator):
    """Under torch.compile the grid sizes become symbols once the input size changes (automatic dynamic shapes):
    the operator's ``SymInt[]`` sizes follow them, so the graph compiled for the second size decodes the third
    right. (With ``int[]`` a yolo11n forward compiled by inductor baked the second size's grids into its graph and
    failed the anchor-count check at the third size; this operator-only graph did not show that.)"""

    def decode(boxes, scores, *levels):  # the grid sizes come from tensor shapes, as in the head
        return torch.ops.yolo_fastdetect.detect_decode(
            boxes, scores, [size for level in levels for size in level.shape], [8.0, 16.0, 32.0], 16, True
        )

    require()  # the operator is called directly: load it
    compiled = torch.compile(decode, backend="inductor", fullgraph=True)
    for name in ("320x256", "480x640", "odd-anchors"):
        level_shapes, _ = LAYOUTS[name]
        boxes, scores = random_head_outputs(generator, 1, 3, level_shapes, 16, torch.float32, "cpu")
        levels = [torch.empty(h, w) for h, w in level_shapes]
        assert torch.equal(compiled(boxes, scores, *levels), decode(boxes, scores, *levels)), name

def _call(device, boxes_shape=(2, 64, 91), scores_shape=(2, 5, 91), level_shapes=((7, 13),), level_strides=(16,),
          reg_max=16, dtype=torch.float32, scores_dtype=None, scores_device=None):
    boxes = torch.randn(boxes_shape, device=device).to(dtype)
    scores = torch.randn(scores_shape, device=scores_device or device).to(scores_dtype or dtype)
    flat_shapes = [size for shape in level_shapes for size in shape]
    return torch.ops.yolo_fastdetect.detect_decode(boxes, scores, flat_shapes, list(map(float, level_strides)),
                                                   reg_max, True)


BAD_INPUTS = {
    "boxes rank": (dict(boxes_shape=(64, 91)), ValueError, "boxes"),
    "scores rank": (dict(scores_shape=(2, 5, 91, 1)), ValueError, "scores"),
    "box channels": (dict(boxes_shape=(2, 60, 91)), ValueError, "4\\*reg_max"),
    "batch mismatch": (dict(scores_shape=(3, 5, 91)), ValueError, "batch"),
    "anchor mismatch": (dict(scores_shape=(2, 5, 90)), ValueError, "anchors"),
    "levels sum": (dict(level_shapes=((7, 12),)), ValueError, "level_shapes"),
    "level count": (dict(level_shapes=((7, 13), (1, 1)),), ValueError, "level_shapes"),
    "level size": (dict(level_shapes=((0, 13),), boxes_shape=(2, 64, 0), scores_shape=(2, 5, 0)), ValueError,
                   "level_shapes"),
    "stride": (dict(level_strides=(-8,)), ValueError, "level_strides"),
    "reg_max": (dict(reg_max=8, boxes_shape=(2, 32, 91)), ValueError, "reg_max"),
    "dtype": (dict(dtype=torch.float64), TypeError, "boxes"),
    "dtype int": (dict(dtype=torch.int32), TypeError, "boxes"),
    "dtype mismatch": (dict(scores_dtype=torch.float16), TypeError, "scores"),
}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_raises_naming_argument(device, case):
    kwargs, error, name = BAD_INPUTS[case]
    with pytest.raises(error, match=name):
        _call(device, **kwargs)


@pytest.mark.cuda
def test_inputs_on_different_devices():
    with pytest.raises(RuntimeError, match="scores"):
        _call("cuda", scores_device="cpu")


@pytest.mark.parametrize("device", devices())
def test_inputs_that_require_grad_are_refused(device, generator):
    """The operator has no backward: with gradients wanted it raises (its output used to claim requires_grad and
    leave the inputs' .grad None), under no_grad it decodes."""
    boxes = torch.randn(2, 64, 21, generator=generator).to(device).requires_grad_()
    scores = torch.randn(2, 3, 21, generator=generator).to(device)
    with pytest.raises(RuntimeError, match="no backward"):
        detect_decode(boxes, scores, [(3, 7)], [8])
    with torch.no_grad():
        out = detect_decode(boxes, scores, [(3, 7)], [8])
    reference = detect_decode_reference(boxes.detach().double(), scores.double(), [(3, 7)], [8])
    torch.testing.assert_close(out.double(), reference, atol=1e-3, rtol=1e-4)
