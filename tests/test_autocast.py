"""The public operators under ``torch.autocast``: autocast casts none of their arguments (the library registers no
autocast kernel), so each one computes in the dtype of its inputs. float32 inputs give the float32 result bit for
bit; inputs in the autocast dtype, as an autocast model produces them, give that dtype's result, which is checked
against the float64 (or exact) reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import devices
from test_detect_decode import assert_rounded_alike
from yolo_fastdetect import _ext
from yolo_fastdetect.ops import (
    MultiScaleRoIAlign,
    batched_nms,
    detect_decode,
    detect_decode_reference,
    fpn_levels,
    letterbox,
    non_max_suppression,
    non_max_suppression_reference,
    roi_align,
    roi_align_reference,
)

pytestmark = pytest.mark.skipif(not _ext.available(), reason="operators not built")

# The dtype autocast computes in on each device, and the tolerance of one rounding to it of a result near 1 (pooled
# features, probabilities); boxes in pixels are compared relative to their size.
AUTOCAST_DTYPE = {"cpu": torch.bfloat16, "cuda": torch.float16}
TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def autocast(device: str):
    return torch.autocast(device, dtype=AUTOCAST_DTYPE[device])


def normal(generator, *shape, device="cpu", scale=1.0):
    return (torch.randn(*shape, generator=generator) * scale).to(device)


def boxes_in(generator, count, height, width, device):
    """(count, 4) x1, y1, x2, y2 inside a height x width image, from 2 pixels to half the image wide."""
    corner = torch.rand(count, 2, generator=generator) * torch.tensor([width, height]) * 0.5
    size = 2 + torch.rand(count, 2, generator=generator) * torch.tensor([width, height]) * 0.5
    return torch.cat((corner, corner + size), 1).to(device)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_roi_align(generator, device, pool_mode):
    x = normal(generator, 2, 8, 12, 16, device=device)
    rois = torch.cat((torch.arange(10.0)[:, None] % 2, boxes_in(generator, 10, 24, 32, "cpu")), 1).to(device)
    outside = roi_align(x, rois, 3, 0.5, 2, pool_mode)
    with autocast(device):
        inside = roi_align(x, rois, 3, 0.5, 2, pool_mode)
    assert inside.dtype == torch.float32 and torch.equal(inside, outside)

    # An autocast model's features are 16-bit; float32 boxes keep their coordinates exact.
    dtype = AUTOCAST_DTYPE[device]
    x16 = x.to(dtype).requires_grad_(True)
    with autocast(device):
        out = roi_align(x16, rois, 3, 0.5, 2, pool_mode)
    assert out.dtype == dtype and torch.equal(out, roi_align(x16, rois, 3, 0.5, 2, pool_mode))
    reference_input = x16.detach().double().cpu().requires_grad_(True)
    expected = roi_align_reference(reference_input, rois.double().cpu(), 3, 0.5, 2, pool_mode)
    torch.testing.assert_close(out.double().cpu(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    gradient = normal(generator, *out.shape, device=device).to(dtype)
    with autocast(device):
        out.backward(gradient)
    expected.backward(gradient.double().cpu())
    assert x16.grad.dtype == dtype
    tolerance = 4 * TOLERANCE[dtype]  # as test_roi_align's backward test: a few roundings of the sums
    torch.testing.assert_close(x16.grad.double().cpu(), reference_input.grad, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("device", devices())
def test_multiscale_roi_align_on_autocast_features(generator, device):
    """The pyramid an autocast model computes (convolutions: 16-bit maps), pooled by MultiScaleRoIAlign."""
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator)))  # the convolutions' weights
    convs = torch.nn.ModuleList(torch.nn.Conv2d(3, 8, 3, stride=s, padding=1) for s in (8, 16, 32)).to(device)
    image = torch.rand(2, 3, 128, 160, generator=generator).to(device)
    boxes = [boxes_in(generator, 12, 128, 160, device) for _ in range(2)]
    pool = MultiScaleRoIAlign(7, (8, 16, 32), sampling_ratio=2, canonical_size=32, canonical_level=4)
    with autocast(device):
        maps = [conv(image) for conv in convs]
        out = pool(maps, boxes)
        float_maps = [m.float() for m in maps]
        out_float = pool(float_maps, boxes)
    dtype = AUTOCAST_DTYPE[device]
    assert all(m.dtype == dtype for m in maps) and out.dtype == dtype and out_float.dtype == torch.float32
    assert torch.equal(out, pool(maps, boxes)) and torch.equal(out_float, pool(float_maps, boxes))
    # Reference: each RoI pooled in float64 from the level the FPN rule gives it, from the same 16-bit maps.
    rois = torch.cat([torch.cat((torch.full((len(b), 1), float(i), device=device), b), 1) for i, b in enumerate(boxes)])
    levels = fpn_levels(rois, (8, 16, 32), canonical_size=32, canonical_level=4).tolist()
    assert len(set(levels)) > 1
    expected = torch.cat([
        roi_align_reference(maps[level].detach().double().cpu(), rois[k : k + 1].double().cpu(), 7, 1 / 8 / 2**level, 2)
        for k, level in enumerate(levels)
    ])
    torch.testing.assert_close(out.double().cpu(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    torch.testing.assert_close(out_float.double().cpu(), expected, rtol=1e-5, atol=1e-5)


def head_output(generator, batch, num_classes, num_anchors, device):
    """(B, 4 + nc, A): cx, cy, w, h in a 640-pixel image, then class scores in [0, 1)."""
    centres = torch.rand(batch, 2, num_anchors, generator=generator) * 640
    sizes = 8 + torch.rand(batch, 2, num_anchors, generator=generator) * 120
    scores = torch.rand(batch, num_classes, num_anchors, generator=generator) ** 4
    return torch.cat((centres, sizes, scores), 1).to(device)


@pytest.mark.parametrize("device", devices())
def test_batched_nms_and_non_max_suppression(generator, device):
    prediction = head_output(generator, 3, 5, 500, device)
    outside = batched_nms(prediction, 5, 0.3, 0.5)
    with autocast(device):
        inside = batched_nms(prediction, 5, 0.3, 0.5)
    assert all(torch.equal(a, b) for a, b in zip(inside, outside))

    prediction16 = prediction.to(AUTOCAST_DTYPE[device])
    with autocast(device):
        detections = non_max_suppression(prediction16, 0.3, 0.5)
        raw = batched_nms(prediction16, 5, 0.3, 0.5)
    assert all(torch.equal(a, b) for a, b in zip(raw, batched_nms(prediction16, 5, 0.3, 0.5)))
    # Exact, order included: the reference computes in float32 from the same 16-bit values.
    reference = non_max_suppression_reference(prediction16.cpu(), 0.3, 0.5)
    assert sum(len(d) for d in reference) > 0
    for mine, theirs in zip(detections, reference):
        assert mine.dtype == torch.float32
        torch.testing.assert_close(mine.cpu(), theirs, rtol=0, atol=0)


@pytest.mark.parametrize("device", devices())
def test_detect_decode(generator, device):
    level_shapes, level_strides = [(12, 16), (6, 8), (3, 4)], [8, 16, 32]
    num_anchors = sum(h * w for h, w in level_shapes)
    boxes = normal(generator, 2, 64, num_anchors, device=device, scale=3)
    scores = normal(generator, 2, 7, num_anchors, device=device, scale=4)
    with torch.no_grad():
        outside = detect_decode(boxes, scores, level_shapes, level_strides)
        with autocast(device):
            inside = detect_decode(boxes, scores, level_shapes, level_strides)
        assert inside.dtype == torch.float32 and torch.equal(inside, outside)

        dtype = AUTOCAST_DTYPE[device]
        boxes16, scores16 = boxes.to(dtype), scores.to(dtype)
        with autocast(device):
            out = detect_decode(boxes16, scores16, level_shapes, level_strides)
        assert out.dtype == dtype and torch.equal(out, detect_decode(boxes16, scores16, level_shapes, level_strides))
    # The 16-bit decode rounds as stock's, as the reference does in that dtype (test_decode_half_rounding).
    expected = detect_decode_reference(boxes16, scores16, level_shapes, level_strides)
    assert_rounded_alike(out, expected, max(level_strides), 16)


@pytest.mark.parametrize("device", devices())
def test_letterbox(generator, device):
    """``dtype`` sets the input's dtype whatever autocast says; the values are stock's uint8 canvas / 255."""
    from ultralytics.data.augment import LetterBox

    images = [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=generator).numpy()
              for h, w in ((333, 517), (480, 360))]
    canvas = torch.from_numpy(np.stack([LetterBox(320)(image=image) for image in images])).to(device)
    for dtype in (torch.float32, AUTOCAST_DTYPE[device]):
        outside = letterbox(images, 320, dtype=dtype, device=device)[0]
        with autocast(device):
            inside = letterbox(images, 320, dtype=dtype, device=device)[0]
        expected = canvas.permute(0, 3, 1, 2).flip(1).to(dtype).div_(255)  # as stock preprocess converts
        assert inside.dtype == dtype and torch.equal(inside, outside) and torch.equal(inside, expected)
