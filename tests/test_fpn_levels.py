"""fpn_levels, the FPN level of each RoI (the assignment MultiScaleRoIAlign pools by): against torchvision's
LevelMapper away from and at the level boundaries, degenerate boxes, dtypes and strided views, bad arguments, the
schema (opcheck), CPU == CUDA bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision

from conftest import devices
from yolo_fastdetect import _ext
from yolo_fastdetect.ops import fpn_levels

pytestmark = pytest.mark.skipif(not _ext.available(), reason="operators not built")


def log_uniform_rois(generator, count, dtype=torch.float64, low=0.5, high=2500.0):
    """(count, 5) rois with sqrt(area) log-uniform in [low, high] pixels (below P3 to above P5), random aspect
    ratios and corners; float64 values rounded to `dtype`."""
    uniform = torch.rand(count, 2, generator=generator, dtype=torch.float64)
    size = torch.exp(math.log(low) + uniform[:, 0] * math.log(high / low))
    aspect = torch.exp(uniform[:, 1] * 2 - 1)
    corner = torch.rand(count, 2, generator=generator, dtype=torch.float64) * 640
    wh = torch.stack((size * aspect, size / aspect), 1)
    batch_index = torch.randint(0, 4, (count, 1), generator=generator).double()
    return torch.cat((batch_index, corner, corner + wh), 1).to(dtype)


def torchvision_levels(rois, k_min, k_max, canonical_size=224, canonical_level=4):
    mapper = torchvision.ops.poolers.LevelMapper(k_min, k_max, canonical_size, canonical_level)
    return mapper([rois[:, 1:]])


def near_level_boundary(rois, canonical_size=224, canonical_level=4, eps=1e-6, margin=1e-5):
    """RoIs whose exact FPN value k0 + log2(sqrt(area) / s0) + eps lies within `margin` of an integer: there
    torchvision's rounding (float32 area, sqrt, log2) may fall on either side."""
    boxes = rois[:, 1:].double()
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    value = canonical_level + torch.log2(area.sqrt() / canonical_size) + eps
    return (value - value.round()).abs() < margin


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "strides, canonical_size, canonical_level",
    [((8, 16, 32), 224, 4), ((4, 8, 16, 32, 64), 224, 4), ((8, 16, 32), 32, 4), ((2,), 224, 4), ((16, 32), 100, 3)],
)
def test_fpn_levels_matches_torchvision(generator, device, dtype, strides, canonical_size, canonical_level):
    rois = log_uniform_rois(generator, 20000, dtype).to(device)
    ours = fpn_levels(rois, strides, canonical_size, canonical_level)
    assert ours.dtype == torch.int64 and ours.shape == (20000,) and ours.device == rois.device
    k_min, k_max = round(math.log2(strides[0])), round(math.log2(strides[-1]))
    theirs = torchvision_levels(rois, k_min, k_max, canonical_size, canonical_level)
    assert set(ours.tolist()) == set(range(len(strides)))
    # Exact agreement away from the boundaries (float32: within 1e-5 levels of one, rounding decides; float64: the
    # two computations agree to ~1e-15, a margin no random box falls in).
    near = near_level_boundary(rois, canonical_size, canonical_level, margin=1e-5 if dtype == torch.float32 else 1e-12)
    assert near.float().mean() < 1e-3
    assert torch.equal(ours[~near], theirs[~near])


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fpn_levels_at_boundaries(device, dtype):
    """Boxes whose sqrt(area) is exactly a level's lower bound (112, 224, 448 for P3-P5), eps below it (still that
    level), well below it, and out of range: the same level as torchvision's LevelMapper."""
    below = 2 ** -1e-5  # 1e-5 levels down: past eps (1e-6), the level below
    within_eps = 2 ** -2e-7  # 2e-7 levels down: eps lifts it to the level above
    sides = [
        ((112, 112), 0), ((224, 224), 1), ((448, 448), 2), ((56, 224), 0), ((112, 448), 1), ((896, 224), 2),
        ((224 * below, 224), 0), ((448 * below, 448), 1), ((224 * within_eps, 224), 1), ((448, 448 * within_eps), 2),
        ((111.9, 112), 0), ((2000, 2000), 2), ((1, 1), 0), ((0.01, 0.01), 0), ((895.9, 896), 2),
    ]
    rois = torch.tensor([[0, 10.0, 20.0, 10.0 + w, 20.0 + h] for (w, h), _ in sides], dtype=dtype, device=device)
    ours = fpn_levels(rois, (8, 16, 32))
    assert ours.tolist() == [level for _, level in sides]
    assert torch.equal(ours, torchvision_levels(rois, 3, 5))


@pytest.mark.parametrize("device", devices())
def test_fpn_levels_degenerate_boxes(device):
    """Zero area -> the lowest level (torchvision: log2(0) = -inf, clamped); one side inverted, NaN -> -1 (torchvision
    gets NaN from sqrt, an undefined level); both sides inverted is a positive area; an infinite area -> highest."""
    nan, inf = float("nan"), float("inf")
    cases = [
        ([5, 5, 5, 300], 0), ([5, 5, 300, 5], 0), ([5, 5, 5, 5], 0), ([5, 5, 5, 1], 0),  # zero area (also -0.0)
        ([300, 5, 5, 300], -1), ([5, 300, 300, 5], -1), ([5, 5, 4.999, 6], -1),  # one side inverted
        ([500, 500, 5, 5], 2), ([230, 230, 5, 5], 1),  # both inverted: a positive area
        ([nan, 5, 300, 300], -1), ([5, 5, 300, nan], -1), ([5, 5, inf, 300], 2), ([-inf, 5, inf, 300], 2),
        ([5, 5, inf, 5], -1),  # inf * 0 = NaN
    ]
    rois = torch.tensor([[0.0, *box] for box, _ in cases], device=device)
    assert fpn_levels(rois, (8, 16, 32)).tolist() == [level for _, level in cases]
    regular = [k for k, (box, level) in enumerate(cases) if level >= 0 and all(map(math.isfinite, box))]
    assert torch.equal(fpn_levels(rois[regular], (8, 16, 32)), torchvision_levels(rois[regular], 3, 5))
    empty = fpn_levels(torch.zeros(0, 5, device=device), (8, 16, 32))
    assert empty.shape == (0,) and empty.dtype == torch.int64 and empty.device == rois.device


@pytest.mark.parametrize("device", devices())
def test_fpn_levels_dtypes_and_strides(generator, device):
    """16-bit rois give the level of their float32 values; any strides (a column slice, a transposed buffer)."""
    rois = log_uniform_rois(generator, 3000, torch.float64).to(device)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        rounded = rois.to(dtype)
        assert torch.equal(fpn_levels(rounded, (8, 16, 32)), fpn_levels(rounded.double(), (8, 16, 32)))
    expected = fpn_levels(rois, (8, 16, 32))
    wider = torch.zeros(3000, 7, dtype=torch.float64, device=device)
    wider[:, 1:6] = rois
    transposed = rois.t().contiguous().t()
    for view in (wider[:, 1:6], transposed, rois[::2]):
        assert not view.is_contiguous()
    assert torch.equal(fpn_levels(wider[:, 1:6], (8, 16, 32)), expected)
    assert torch.equal(fpn_levels(transposed, (8, 16, 32)), expected)
    assert torch.equal(fpn_levels(rois[::2], (8, 16, 32)), expected[::2])


@pytest.mark.parametrize("device", devices())
def test_fpn_levels_bad_arguments(device):
    rois = torch.tensor([[0, 1.0, 1.0, 5.0, 5.0]], device=device)
    op = torch.ops.yolo_fastdetect.fpn_levels
    with pytest.raises(ValueError, match=r"rois must be \(K, 5\)"):
        op(rois[:, :4], 3, 3, 224.0, 4, 1e-6)
    with pytest.raises(ValueError, match=r"rois must be \(K, 5\)"):
        op(rois[0], 3, 3, 224.0, 4, 1e-6)
    with pytest.raises(TypeError, match="rois must be float32, float64, float16 or bfloat16"):
        op(rois.int(), 3, 3, 224.0, 4, 1e-6)
    for num_levels in (0, 9, -1):
        with pytest.raises(ValueError, match=r"num_levels must be in \[1, 8\], got " + str(num_levels)):
            op(rois, 3, num_levels, 224.0, 4, 1e-6)
    for size in (0.0, -224.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="canonical_size must be positive and finite"):
            op(rois, 3, 3, size, 4, 1e-6)
    with pytest.raises(ValueError, match="eps must be finite"):
        op(rois, 3, 3, 224.0, 4, float("nan"))
    with pytest.raises(ValueError, match="num_levels"):
        fpn_levels(rois, [2**i for i in range(9)])
    with pytest.raises(ValueError, match="strides"):
        fpn_levels(rois, (8, 12, 32))
    with pytest.raises(ValueError, match="canonical_size"):
        fpn_levels(rois, (8, 16, 32), canonical_size=0)


@pytest.mark.parametrize("device", devices())
def test_fpn_levels_opcheck(generator, device):
    rois = log_uniform_rois(generator, 50, torch.float32).to(device)
    for args in ((rois, 3, 3, 224.0, 4, 1e-6), (rois[:0], 3, 3, 224.0, 4, 1e-6), (rois.half(), 2, 5, 32.0, 3, 0.0)):
        torch.library.opcheck(torch.ops.yolo_fastdetect.fpn_levels.default, args)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_fpn_levels_cuda_matches_cpu(generator, dtype):
    """Bit for bit: random boxes, boxes on and next to every boundary, degenerate boxes; a strided view."""
    rois = log_uniform_rois(generator, 100000, torch.float64)
    edges = torch.tensor([56.0, 112.0, 224.0, 448.0, 896.0], dtype=torch.float64)
    edges = torch.cat([edges * 2 ** (k * 1e-7) for k in range(-20, 21)])
    exact = torch.stack((torch.zeros_like(edges), torch.zeros_like(edges), torch.zeros_like(edges), edges, edges), 1)
    special = torch.tensor([[0, 5, 5, 5, 5], [0, 9, 5, 5, 9], [0, float("nan"), 5, 6, 6], [0, 5, 5, float("inf"), 6]],
                           dtype=torch.float64)
    rois = torch.cat((rois, exact, special)).to(dtype)
    for strides, size, level in (((8, 16, 32), 224.0, 4), ((4, 8, 16, 32, 64, 128, 256, 512), 100.0, 2)):
        cpu = fpn_levels(rois, strides, size, level)
        cuda = fpn_levels(rois.cuda(), strides, size, level)
        assert torch.equal(cuda.cpu(), cpu)
        wider = torch.zeros(len(rois), 8, dtype=dtype, device="cuda")
        wider[:, 2:7] = rois.cuda()
        assert torch.equal(fpn_levels(wider[:, 2:7], strides, size, level).cpu(), cpu)
