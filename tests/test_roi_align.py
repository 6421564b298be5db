"""RoIAlign and MultiScaleRoIAlign: float64 reference, torchvision, gradients, edge cases, bad input, CPU == CUDA.
(The FPN level assignment that MultiScaleRoIAlign uses has its own file, test_fpn_levels.py.)"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torchvision

from conftest import devices
from yolo_fastdetect import _ext
from yolo_fastdetect.ops import (
    MultiScaleRoIAlign,
    RoIAlign,
    boxes_to_rois,
    fpn_levels,
    multiscale_roi_align,
    roi_align,
    roi_align_reference,
)

pytestmark = pytest.mark.skipif(not _ext.available(), reason="operators not built")

# Tolerances against the float64 reference for each feature dtype (16-bit: one rounding of the result).
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def random_rois(generator, batch, height, width, count, spatial_scale=1.0, margin=0.2):
    """(count, 5) rois over every image of the batch, in input pixels, reaching up to `margin` outside the map."""
    extent = torch.tensor([width, height], dtype=torch.float64) / spatial_scale
    corner = (torch.rand(count, 2, generator=generator, dtype=torch.float64) * (1 + 2 * margin) - margin) * extent
    size = torch.rand(count, 2, generator=generator, dtype=torch.float64) * 0.6 * extent
    batch_index = torch.arange(count, dtype=torch.float64).remainder(batch)[:, None]  # every image gets RoIs
    return torch.cat((batch_index, corner, corner + size), 1)


def features(generator, shape, dtype=torch.float64, device="cpu"):
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device)


def roi_align_inputs(generator, shape, count, spatial_scale=1.0, dtype=torch.float32, device="cpu", *,
                     requires_grad=False):
    """Random (N, C, H, W) features of `dtype` and `count` :func:`random_rois` over the same N images and H x W map
    (taken at `spatial_scale`): float64 rois for float64 features, float32 for the others, as roi_align accepts them.
    Returns (features, rois), drawn in that order from `generator`."""
    batch, _, height, width = shape
    x = features(generator, shape, dtype, device).requires_grad_(requires_grad)
    rois = random_rois(generator, batch, height, width, count, spatial_scale)
    return x, rois.to(device=device, dtype=torch.float64 if dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [True, False])
def test_matches_reference(generator, device, dtype, pool_mode, aligned):
    x, rois = roi_align_inputs(generator, (3, 6, 11, 19), 24, 0.5, dtype, device)
    for sampling_ratio in (0, 1, 3):
        out = roi_align(x, rois, (4, 3), 0.5, sampling_ratio, pool_mode, aligned)
        # The reference sees the same (rounded) features and boxes, in float64.
        expected = roi_align_reference(x.double().cpu(), rois.double().cpu(), (4, 3), 0.5, sampling_ratio, pool_mode,
                                       aligned)
        assert out.dtype == dtype and out.shape == (24, 6, 4, 3)
        torch.testing.assert_close(out.double().cpu(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("sampling_ratio", [0, 1, 2, 4])
def test_matches_torchvision(generator, device, aligned, sampling_ratio):
    x, rois = roi_align_inputs(generator, (2, 5, 17, 13), 40, 0.25, device=device)
    out = roi_align(x, rois, (5, 7), 0.25, sampling_ratio, "avg", aligned)
    expected = torchvision.ops.roi_align(x, rois, (5, 7), 0.25, sampling_ratio, aligned)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_max_mode_hand_computed():
    # A 1x1x4x4 ramp; with aligned=False and scale 1 the RoI [0, 0, 2, 2] has one bin of 2x2 samples at
    # x, y in {0.5, 1.5}: values 10 * y + x at those points (bilinear of a linear ramp is exact).
    ramp = (10 * torch.arange(4.0)[:, None] + torch.arange(4.0)[None, :]).view(1, 1, 4, 4)
    rois = torch.tensor([[0, 0.0, 0.0, 2.0, 2.0]])
    assert roi_align(ramp, rois, 1, 1.0, 2, "max", False).item() == pytest.approx(16.5)
    assert roi_align(ramp, rois, 1, 1.0, 2, "avg", False).item() == pytest.approx(11.0)
    # The max sample's gradient goes to the four pixels around (1.5, 1.5), a quarter each.
    ramp.requires_grad_(True)
    roi_align(ramp, rois, 1, 1.0, 2, "max", False).sum().backward()
    expected = torch.zeros(4, 4)
    expected[1:3, 1:3] = 0.25
    torch.testing.assert_close(ramp.grad[0, 0], expected)
    # A negative map whose samples all fall outside it: every sample reads 0, so the max is 0, not -inf.
    outside = torch.tensor([[0, 10.0, 10.0, 12.0, 12.0]])
    assert roi_align(-torch.ones(1, 1, 4, 4), outside, 2, 1.0, 2, "max", True).abs().sum() == 0
    # Two bins across rows 1-2: samples at y in {1.25, 1.75}, x in {0.5, 1.5} and {2.5, 3.5}; the max is the
    # bottom-right sample of each bin, and x = 3.5 lies past the last pixel centre, so it reads column 3.
    rois = torch.tensor([[0, 0.0, 1.0, 4.0, 2.0]])
    out = roi_align(ramp.detach(), rois, (1, 2), 1.0, 2, "max", False)
    torch.testing.assert_close(out.view(-1), torch.tensor([17.5 + 1.5, 17.5 + 3.0]))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [True, False])
def test_gradcheck(generator, device, pool_mode, aligned):
    x, rois = roi_align_inputs(generator, (2, 3, 7, 9), 6, 0.5, torch.float64, device, requires_grad=True)
    for sampling_ratio in (0, 2):
        assert torch.autograd.gradcheck(
            lambda t, s=sampling_ratio: roi_align(t, rois, (2, 3), 0.5, s, pool_mode, aligned), (x,), eps=1e-6,
            atol=1e-5,
        )


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_backward_matches_reference(generator, device, dtype, pool_mode):
    x, rois = roi_align_inputs(generator, (2, 4, 10, 14), 16, dtype=dtype)
    grad = features(generator, (16, 4, 3, 3)).to(dtype).double()
    # The reference sees the same (rounded) features and boxes, in float64.
    reference_input = x.double().requires_grad_(True)
    roi_align_reference(reference_input, rois.double(), 3, 1.0, 2, pool_mode).backward(grad)
    x = x.to(device).requires_grad_(True)
    roi_align(x, rois.to(device), 3, 1.0, 2, pool_mode).backward(grad.to(dtype=dtype, device=device))
    tolerance = 1e-5 if dtype == torch.float32 else 4 * TOLERANCE[dtype]
    torch.testing.assert_close(x.grad.double().cpu(), reference_input.grad, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_double_backward_is_refused(generator, device, pool_mode):
    """A gradient taken with create_graph=True is the gradient, but differentiating it again raises, for one level
    and several: the backward operators have no derivative of their own (torchvision's RoIAlign refuses it too)."""
    x, rois = roi_align_inputs(generator, (2, 3, 9, 11), 8, dtype=torch.float64, device=device, requires_grad=True)
    pyramid = [x, features(generator, (2, 3, 5, 6), device=device).requires_grad_(True)]
    reference_input = x.detach().cpu().requires_grad_(True)
    reference_output = roi_align_reference(reference_input, rois.cpu(), 3, 1.0, 2, pool_mode)
    (expected,) = torch.autograd.grad((reference_output**2).sum(), reference_input)
    calls = {
        "roi_align": lambda: roi_align(x, rois, 3, 1.0, 2, pool_mode),
        "multiscale_roi_align": lambda: multiscale_roi_align(pyramid, rois, 3, (1, 2), 2, pool_mode, True, 4, 0),
    }
    for op, call in calls.items():
        # The gradient of out ** 2 is 2 * out * d(out): the backward operator's input requires grad.
        (gradient,) = torch.autograd.grad((call() ** 2).sum(), x, create_graph=True)
        (plain,) = torch.autograd.grad((call() ** 2).sum(), x)
        assert gradient.requires_grad
        # Equal on the CPU; on CUDA the backward's atomic adds sum in any order (1e-16 apart on the H200).
        exact = x.device.type == "cpu"
        torch.testing.assert_close(gradient, plain, rtol=0 if exact else 1e-12, atol=0 if exact else 1e-12)
        if op == "roi_align":
            torch.testing.assert_close(gradient.cpu(), expected, rtol=1e-10, atol=1e-10)
        with pytest.raises(RuntimeError, match=f"{op}: double backward .* is not supported"):
            gradient.sum().backward()


@pytest.mark.parametrize("device", devices())
def test_empty_and_zero_size_rois(generator, device):
    x = features(generator, (2, 3, 8, 8), torch.float32, device).requires_grad_(True)
    empty = roi_align(x, torch.zeros(0, 5, device=device), 2)
    assert empty.shape == (0, 3, 2, 2)
    empty.sum().backward()
    assert x.grad.abs().sum() == 0
    # aligned zero-size RoIs sample nothing (adaptive grid of 0 points): zeros, as in torchvision.
    zero = torch.tensor([[0, 3.0, 3.0, 3.0, 3.0], [1, 5.0, 2.0, 5.0, 6.0]], device=device)
    for pool_mode in ("avg", "max"):
        assert roi_align(x, zero, 2, pool_mode=pool_mode).abs().sum() == 0
    torch.testing.assert_close(roi_align(x, zero, 2, aligned=False), torchvision.ops.roi_align(x, zero, 2))
    torch.testing.assert_close(
        roi_align(x, zero, 2, sampling_ratio=2), torchvision.ops.roi_align(x, zero, 2, 1.0, 2, True)
    )


@pytest.mark.parametrize("device", devices())
def test_rois_outside_the_map(generator, device):
    x = features(generator, (1, 4, 6, 10), torch.float32, device)
    rois = torch.tensor(
        [[0, -5.0, -5.0, 3.0, 2.0], [0, 8.0, 4.0, 14.0, 9.0], [0, 20.0, 20.0, 30.0, 28.0], [0, -9.0, 1.0, -2.0, 5.0]],
        device=device,
    )
    for pool_mode in ("avg", "max"):
        out = roi_align(x, rois, 3, pool_mode=pool_mode, sampling_ratio=2)
        expected = roi_align_reference(x.cpu().double(), rois.cpu().double(), 3, pool_mode=pool_mode, sampling_ratio=2)
        torch.testing.assert_close(out.cpu().double(), expected, rtol=1e-5, atol=1e-6)
        assert out[2].abs().sum() == 0  # wholly outside: zeros


@pytest.mark.parametrize("device", devices())
def test_memory_formats(generator, device):
    base, rois = roi_align_inputs(generator, (2, 9, 12, 10), 20, device=device)
    expected = roi_align(base, rois, 4)
    channels_last = base.contiguous(memory_format=torch.channels_last)
    transposed = base.transpose(2, 3).contiguous().transpose(2, 3)  # H and W swapped in memory
    strided = features(generator, (2, 18, 12, 20), torch.float32, device)[:, ::2, :, ::2]
    strided.copy_(base)
    for variant in (channels_last, transposed, strided):
        assert not variant.is_contiguous() or variant is channels_last
        torch.testing.assert_close(roi_align(variant, rois, 4), expected, rtol=0, atol=0)
    # Gradients have the input's shape whatever its layout.
    variant = channels_last.clone().requires_grad_(True)
    roi_align(variant, rois, 4).sum().backward()
    reference = base.clone().requires_grad_(True)
    roi_align(reference, rois, 4).sum().backward()
    torch.testing.assert_close(variant.grad, reference.grad)


def test_list_of_boxes_and_module(generator):
    x = features(generator, (2, 3, 9, 11), torch.float32)
    boxes = [torch.tensor([[1.0, 2.0, 5.0, 7.0]]), torch.tensor([[0.0, 0.0, 3.0, 4.0], [2.0, 1.0, 9.0, 8.0]])]
    rois = boxes_to_rois(boxes)
    assert rois[:, 0].tolist() == [0, 1, 1]
    module = RoIAlign((2, 3), spatial_scale=0.5, sampling_ratio=2, pool_mode="max")
    torch.testing.assert_close(module(x, boxes), roi_align(x, rois, (2, 3), 0.5, 2, "max"))
    assert "pool_mode='max'" in repr(module)


def per_image_batch_index(boxes):
    """boxes_to_rois' batch-index column the obvious way: one torch.full per image."""
    return torch.cat([torch.full((len(b), 1), i, dtype=b.dtype, device=b.device) for i, b in enumerate(boxes)])


@pytest.mark.parametrize("device", devices())
def test_boxes_to_rois(generator, device):
    boxes = [torch.rand(n, 4, generator=generator).to(device) * 100 for n in (3, 0, 5, 1)]
    rois = boxes_to_rois(boxes)
    assert rois.device == boxes[0].device and rois.dtype == torch.float32
    assert torch.equal(rois, torch.cat((per_image_batch_index(boxes), torch.cat(boxes)), 1))
    assert rois[:, 0].tolist() == [0, 0, 0, 2, 2, 2, 2, 2, 3]
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        typed = [b.to(dtype) for b in boxes]
        assert torch.equal(boxes_to_rois(typed), torch.cat((per_image_batch_index(typed), torch.cat(typed)), 1))
    assert boxes_to_rois([boxes[1]]).shape == (0, 5)
    assert boxes_to_rois(iter(boxes)).shape == (9, 5)  # any iterable of tensors
    assert boxes_to_rois(rois) is rois
    leaf = boxes[0].clone().requires_grad_(True)
    boxes_to_rois([leaf, leaf * 2]).sum().backward()
    assert leaf.grad.tolist() == [[3.0] * 4] * 3
    with pytest.raises(ValueError, match="empty list"):
        boxes_to_rois([])
    with pytest.raises(ValueError, match=r"image 1 boxes must be \(L, 4\) x1, y1, x2, y2, got \(2, 5\)"):
        boxes_to_rois([boxes[0], torch.zeros(2, 5, device=device)])
    with pytest.raises(ValueError, match=r"image 0 boxes must be \(L, 4\)"):
        boxes_to_rois([torch.zeros(4, device=device)])


@pytest.mark.cuda
def test_boxes_to_rois_under_graph_capture(generator):
    """A copy from the host cannot be captured: under capture the batch-index column is filled on the device."""
    boxes = [torch.rand(n, 4, generator=generator).cuda() for n in (2, 0, 3)]
    expected = boxes_to_rois(boxes)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rois = boxes_to_rois(boxes)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(rois, expected)


@pytest.mark.parametrize("device", devices())
def test_bad_input(generator, device):
    x = features(generator, (2, 3, 8, 8), torch.float32, device)
    good = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]], device=device)
    with pytest.raises(IndexError, match="batch indices"):
        roi_align(x, torch.tensor([[2, 1.0, 1.0, 5.0, 5.0]], device=device), 2)
    with pytest.raises(IndexError, match="batch indices"):
        roi_align(x, torch.tensor([[-1, 1.0, 1.0, 5.0, 5.0]], device=device), 2)
    with pytest.raises(ValueError, match=r"rois must be \(K, 5\)"):
        roi_align(x, good[:, :4], 2)
    with pytest.raises(TypeError, match="rois dtype"):
        roi_align(x, good.double(), 2)
    with pytest.raises(TypeError, match="features must be"):
        roi_align(x.int(), good, 2)
    with pytest.raises(ValueError, match="output_size must be positive"):
        roi_align(x, good, (0, 2))
    with pytest.raises(ValueError, match=r"output_size x sampling_ratio must be below 2\^31"):
        roi_align(x, good, (70000, 1), sampling_ratio=32768)  # 2.3e9 samples down one side
    with pytest.raises(ValueError, match="pool_mode"):
        roi_align(x, good, 2, pool_mode="sum")
    with pytest.raises(ValueError, match="spatial_scale"):
        roi_align(x, good, 2, spatial_scale=0.0)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        roi_align(x[0], good, 2)
    with pytest.raises(ValueError, match="1 to 8 feature maps"):
        torch.ops.yolo_fastdetect.multiscale_roi_align([x] * 9, good, torch.zeros(1, dtype=torch.long, device=device),
                                                       2, 2, [1.0] * 9, 0, True, False)


@pytest.mark.cuda
def test_mismatched_devices(generator):
    x = features(generator, (1, 3, 8, 8), torch.float32, "cuda")
    with pytest.raises(RuntimeError, match="rois is on"):
        roi_align(x, torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]]), 2)


@pytest.mark.parametrize("device", devices())
def test_bad_indices_pool_zeros_without_validation(generator, device):
    """The kernels themselves never read outside the features: called with validation skipped (as under graph
    capture, here through the level table), RoIs with a bad level or batch index pool zeros."""
    x = features(generator, (2, 3, 8, 8), torch.float32, device)
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]] * 3, device=device)
    levels = torch.tensor([0, 1, -3], device=device)  # level 1 and -3 do not exist
    out, _ = torch.ops.yolo_fastdetect.multiscale_roi_align([x], rois, levels, 2, 2, [1.0], 0, True, False)
    assert out[0].abs().sum() > 0 and out[1:].abs().sum() == 0


@pytest.mark.cuda
def test_bad_batch_index_under_graph_capture(generator):
    x = features(generator, (2, 3, 8, 8), torch.float32, "cuda")
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0], [7, 1.0, 1.0, 5.0, 5.0], [float("nan"), 1.0, 1.0, 5.0, 5.0]],
                        device="cuda")
    roi_align(x, rois[:1], 2)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = roi_align(x, rois, 2)
    graph.replay()
    torch.cuda.synchronize()
    assert out[0].abs().sum() > 0 and out[1:].abs().sum() == 0


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize(
    "layout", ["nchw-70", "nchw-264", "channels-last-264", "channels-last-272", "channel-offset-264"]
)
def test_cuda_matches_cpu(generator, dtype, pool_mode, layout):
    """Larger than the other tests: several channel chunks, bin chunks (9 x 9 = 81 bins) and channel packets of
    every width: 70 channels take 2-wide packets, 264 16-byte packets (4 float32, 8 half) with a partly filled
    last chunk, 272 as many 16-bit packets as a chunk's 32 lanes plus two; a map that starts one channel into a
    channels-last buffer is misaligned for packets and takes one channel per lane."""
    channels = int(layout.rsplit("-", 1)[1])
    x, rois = roi_align_inputs(generator, (3, channels, 23, 31), 200, 0.5, dtype)
    grad = features(generator, (200, channels, 9, 9), dtype)
    outputs, grads = [], []
    for device in ("cpu", "cuda"):
        if layout == "channel-offset-264":
            wider = features(generator, (3, channels + 1, 23, 31), dtype, device)
            wider = wider.contiguous(memory_format=torch.channels_last)
            leaf = wider[:, 1:].detach()
            leaf.copy_(x)
            leaf.requires_grad_(True)
        elif layout.startswith("channels-last"):
            leaf = x.to(device).contiguous(memory_format=torch.channels_last).requires_grad_(True)
        else:
            leaf = x.detach().to(device).requires_grad_(True)  # a fresh leaf on each device
        out = roi_align(leaf, rois.to(device), 9, 0.5, 0, pool_mode)
        out.backward(grad.to(device))
        outputs.append(out.cpu().double())
        grads.append(leaf.grad.cpu().double())
    tolerance = max(TOLERANCE[dtype], 1e-6)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=tolerance, atol=tolerance)
    # Atomic float32 accumulation on the GPU sums in another order than the CPU.
    close = torch.isclose(grads[1], grads[0], rtol=10 * tolerance, atol=10 * tolerance)
    if pool_mode == "avg":
        assert close.all()
    else:
        # Where two samples of a bin are within rounding of each other (the GPU contracts to FMA, the CPU build does
        # not), the two devices may pick different maxima and send that bin's gradient to different pixels: a few
        # elements in a million, seen at 5 of 564696.
        assert (~close).sum().item() <= 1e-4 * close.numel()


@pytest.mark.parametrize("device", devices())
def test_opcheck(generator, device):
    x, rois = roi_align_inputs(generator, (2, 4, 9, 7), 5, device=device, requires_grad=True)
    for max_mode in (False, True):
        torch.library.opcheck(torch.ops.yolo_fastdetect.roi_align.default, (x, rois, 2, 3, 1.0, 2, True, max_mode))
        levels = fpn_levels(rois, (1, 2))
        pyramid = [x, features(generator, (2, 4, 5, 4), torch.float32, device).requires_grad_(True)]
        torch.library.opcheck(
            torch.ops.yolo_fastdetect.multiscale_roi_align.default,
            (pyramid, rois, levels, 2, 2, [1.0, 0.5], 2, False, max_mode),
        )


def test_torch_compile(generator):
    x, rois = roi_align_inputs(generator, (2, 4, 9, 7), 5, requires_grad=True)
    compiled = torch.compile(lambda t, r: roi_align(t, r, 3, 1.0, 2, "max").square().sum(), fullgraph=True,
                             backend="aot_eager")
    compiled(x, rois).backward()
    expected = x.detach().clone().requires_grad_(True)
    roi_align(expected, rois, 3, 1.0, 2, "max").square().sum().backward()
    torch.testing.assert_close(x.grad, expected.grad)


def test_torch_export(generator):
    """torch.export keeps roi_align as one operator node (its autograd is registered in C++) and the exported
    module computes what eager mode does, on inputs other than the ones it was traced with."""

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4 * 2 * 3, 5)

        def forward(self, x, rois):
            return self.linear(roi_align(x, rois, (2, 3), 0.5, 2).flatten(1))

    head = Head()
    exported = torch.export.export(head, roi_align_inputs(generator, (2, 4, 9, 7), 5, 0.5))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert torch.ops.yolo_fastdetect.roi_align.default in targets
    x, rois = roi_align_inputs(generator, (2, 4, 9, 7), 5, 0.5)
    torch.testing.assert_close(exported.module()(x, rois), head(x, rois))


# MultiScaleRoIAlign -----------------------------------------------------------------------------------------------


def pyramid_and_boxes(generator, device, dtype=torch.float32, image=(512, 640), count=60):
    """P3-P5 maps of a (2, 8) pyramid for a `image`-sized input, and boxes that land on every level."""
    maps = [features(generator, (2, 8, image[0] // s, image[1] // s), dtype, device) for s in (8, 16, 32)]
    # sqrt(area) from 1.6 to 660 pixels, log-uniform, so that every level gets boxes; random aspect ratios.
    aspect = torch.exp(torch.rand(count, generator=generator) - 0.5)
    size = torch.exp(torch.linspace(0.5, 6.5, count))[:, None] * torch.stack((aspect, 1 / aspect), 1)
    corner = torch.rand(count, 2, generator=generator) * torch.tensor([image[1], image[0]])
    boxes = torch.cat((corner, corner + size), 1).to(dtype=dtype if dtype == torch.float64 else torch.float32,
                                                     device=device)
    return maps, [boxes[: count // 3], boxes[count // 3 :]]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_multiscale_matches_torchvision(generator, device, sampling_ratio):
    maps, boxes = pyramid_and_boxes(generator, device)
    levels = fpn_levels(boxes_to_rois(boxes), (8, 16, 32))
    assert set(levels.tolist()) == {0, 1, 2}
    ours = MultiScaleRoIAlign(7, (8, 16, 32), sampling_ratio, aligned=False)(maps, boxes)
    theirs = torchvision.ops.MultiScaleRoIAlign(["p3", "p4", "p5"], 7, sampling_ratio)(
        OrderedDict(zip(["p3", "p4", "p5"], maps)), boxes, [(512, 640)] * 2
    )
    # torchvision's CUDA build fuses the sample-coordinate arithmetic into FMAs; ours rounds each step as the CPU does,
    # so on the GPU a sample point may move by an ulp or two of its coordinate (below 128 feature pixels: 2**-17), and
    # a bilinear value by that much times the difference of two neighbouring pixels (at most 2 max|feature|).
    coordinate_ulp = torch.finfo(torch.float32).eps * 64
    max_feature = max(m.abs().max().item() for m in maps)
    atol = 1e-6 if device == "cpu" else 2 * coordinate_ulp * 2 * max_feature
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_multiscale_is_roi_align_per_level(generator, device, pool_mode):
    maps, boxes = pyramid_and_boxes(generator, device, torch.float64, image=(128, 96), count=12)
    rois = boxes_to_rois(boxes)
    levels = fpn_levels(rois, (8, 16, 32), canonical_size=32, canonical_level=4)
    maps = [m.requires_grad_(True) for m in maps]
    out = multiscale_roi_align(maps, rois, 3, (8, 16, 32), 2, pool_mode, True, canonical_size=32, canonical_level=4)
    for k, level in enumerate(levels.tolist()):
        single = roi_align(maps[level], rois[k : k + 1], 3, 1 / 8 / 2**level, 2, pool_mode)
        torch.testing.assert_close(out[k : k + 1], single)
    assert torch.autograd.gradcheck(
        lambda *m: multiscale_roi_align(m, rois, 2, (8, 16, 32), 2, pool_mode, True, 32, 4), tuple(maps), atol=1e-5
    )


def test_multiscale_bad_strides(generator):
    maps, boxes = pyramid_and_boxes(generator, "cpu")
    with pytest.raises(ValueError, match="strides"):
        multiscale_roi_align(maps, boxes, 7, strides=(8, 12, 32))
    with pytest.raises(ValueError, match="feature maps"):
        multiscale_roi_align(maps[:2], boxes, 7)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_multiscale_cuda_matches_cpu(generator, dtype):
    maps, boxes = pyramid_and_boxes(generator, "cpu", dtype, count=300)
    results = []
    for device in ("cpu", "cuda"):
        leaves = [m.detach().to(device).requires_grad_(True) for m in maps]  # fresh leaves on each device
        out = multiscale_roi_align(leaves, [b.to(device) for b in boxes], 7, sampling_ratio=2, pool_mode="avg")
        out.float().square().sum().backward()
        results.append([out.cpu().double()] + [leaf.grad.cpu().double() for leaf in leaves])
    tolerance = TOLERANCE[dtype] * 10
    for cuda, cpu in zip(results[1], results[0]):
        torch.testing.assert_close(cuda, cpu, rtol=tolerance, atol=tolerance)
