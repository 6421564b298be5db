"""Multi-level RoIAlign over a feature pyramid: ``yolo_fastdetect::multiscale_roi_align``.

Each RoI is pooled from the one level that fits its size, by the FPN rule (Lin et al. 2017, eq. 1, as
``torchvision.ops.MultiScaleRoIAlign``): ``level = floor(k0 + log2(sqrt(w * h) / canonical_size))`` clamped to the
available levels. The per-RoI level table is computed on the device in one kernel launch, then one more pools every
RoI from its level (torchvision loops over the levels with one gather, one roi_align and one scatter each).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .._ext import on_load, require
from .roi_align import _is_max_mode, _pair, _pooled_fake, boxes_to_rois

__all__ = ["MultiScaleRoIAlign", "fpn_levels", "multiscale_roi_align"]


def _check_strides(strides: Sequence[float]) -> list[float]:
    strides = [float(s) for s in strides]
    first = math.log2(strides[0]) if strides and strides[0] > 0 else math.nan
    if not strides or any(s != strides[0] * 2**i for i, s in enumerate(strides)) or first != round(first):
        raise ValueError(f"strides must be powers of two that double from level to level (FPN), got {strides}")
    return strides


def fpn_levels(
    rois: torch.Tensor,
    strides: Sequence[float],
    canonical_size: float = 224,
    canonical_level: int = 4,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Pyramid level (index into ``strides``) of each RoI of ``rois`` (K, 5), as an int64 ``(K,)`` tensor.

    ``canonical_size`` pixels map to level ``canonical_level`` (stride ``2 ** canonical_level``); each doubling of
    ``sqrt(area)`` moves one level up. The rule of torchvision's ``LevelMapper``, evaluated in one kernel launch
    (``yolo_fastdetect::fpn_levels``) from area thresholds computed in float64, so the CPU and CUDA agree bit for
    bit and torchvision picks the same level except within float rounding of a level boundary. A RoI with a NaN
    or negative area (one side inverted) gets -1, which :func:`multiscale_roi_align` pools as zeros.
    """
    strides = _check_strides(strides)
    require()
    return torch.ops.yolo_fastdetect.fpn_levels(
        rois, round(math.log2(strides[0])), len(strides), float(canonical_size), int(canonical_level), float(eps)
    )


def multiscale_roi_align(
    features: Sequence[torch.Tensor],
    rois: torch.Tensor | Sequence[torch.Tensor],
    output_size: int | Sequence[int],
    strides: Sequence[float] = (8, 16, 32),
    sampling_ratio: int = 0,
    pool_mode: str = "avg",
    aligned: bool = True,
    canonical_size: float = 224,
    canonical_level: int = 4,
) -> torch.Tensor:
    """Pool each RoI from the pyramid level that fits its size (differentiable with respect to every level).

    Args:
        features (Sequence[torch.Tensor]): One ``(N, C, H_l, W_l)`` map per level, finest first, same N, C and dtype.
        rois (torch.Tensor | Sequence[torch.Tensor]): ``(K, 5)`` ``[batch_index, x1, y1, x2, y2]`` in input pixels,
            or a list of per-image ``(L, 4)`` boxes.
        output_size (int | tuple[int, int]): Pooled ``(height, width)``.
        strides (Sequence[float]): Input pixels per feature pixel of each level, doubling (``8, 16, 32`` for P3-P5).
        sampling_ratio, pool_mode, aligned: As :func:`~yolo_fastdetect.ops.roi_align`.
        canonical_size (float), canonical_level (int): The FPN rule's ``224`` and ``k0 = 4``.

    Returns:
        (torch.Tensor): ``(K, C, output_height, output_width)`` in the features' dtype (under ``torch.autocast`` too:
        autocast casts no argument).

    Examples:
        >>> features = [torch.randn(1, 64, 640 // s, 640 // s) for s in (8, 16, 32)]  # P3-P5 of a 640 x 640 image
        >>> rois = torch.tensor([[0.0, 10.0, 20.0, 60.0, 90.0], [0.0, 0.0, 0.0, 600.0, 500.0]])
        >>> multiscale_roi_align(features, rois, 7).shape
        torch.Size([2, 64, 7, 7])
    """
    pooled_height, pooled_width = _pair(output_size)
    max_mode = _is_max_mode(pool_mode)
    strides = _check_strides(strides)
    if len(features) != len(strides):
        raise ValueError(f"got {len(features)} feature maps for {len(strides)} strides")
    rois = boxes_to_rois(rois)
    require()
    output, _ = torch.ops.yolo_fastdetect.multiscale_roi_align.default(
        list(features), rois, fpn_levels(rois, strides, canonical_size, canonical_level), pooled_height,
        pooled_width, [1.0 / s for s in strides], int(sampling_ratio), bool(aligned), max_mode,
    )
    return output


class MultiScaleRoIAlign(nn.Module):
    """``nn.Module`` form of :func:`multiscale_roi_align`: ``forward(features, rois)``.

    Unlike torchvision's class, features are a sequence (not a dict) and the strides are given, not inferred from
    image sizes; ``aligned=False`` with the same strides reproduces torchvision's output.

    Examples:
        >>> pool = MultiScaleRoIAlign(7, strides=(8, 16, 32))
        >>> features = [torch.randn(2, 64, 640 // s, 640 // s) for s in (8, 16, 32)]
        >>> boxes = [torch.tensor([[10.0, 20.0, 60.0, 90.0]]), torch.tensor([[0.0, 0.0, 600.0, 500.0]])]
        >>> pool(features, boxes).shape
        torch.Size([2, 64, 7, 7])
    """

    def __init__(
        self,
        output_size: int | Sequence[int],
        strides: Sequence[float] = (8, 16, 32),
        sampling_ratio: int = 0,
        pool_mode: str = "avg",
        aligned: bool = True,
        canonical_size: float = 224,
        canonical_level: int = 4,
    ) -> None:
        super().__init__()
        self.output_size = _pair(output_size)
        self.strides = _check_strides(strides)
        self.sampling_ratio = int(sampling_ratio)
        _is_max_mode(pool_mode)
        self.pool_mode = pool_mode
        self.aligned = bool(aligned)
        self.canonical_size = float(canonical_size)
        self.canonical_level = int(canonical_level)

    def forward(
        self, features: Sequence[torch.Tensor], rois: torch.Tensor | Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """Pool ``rois`` ((K, 5) or per-image (L, 4) boxes) from ``features`` (one map per stride)."""
        return multiscale_roi_align(
            features, rois, self.output_size, self.strides, self.sampling_ratio, self.pool_mode, self.aligned,
            self.canonical_size, self.canonical_level,
        )

    def extra_repr(self) -> str:
        return (
            f"output_size={self.output_size}, strides={self.strides}, sampling_ratio={self.sampling_ratio}, "
            f"pool_mode={self.pool_mode!r}, aligned={self.aligned}, canonical_size={self.canonical_size}, "
            f"canonical_level={self.canonical_level}"
        )


# Fake kernels (autograd is registered in C++, csrc/roi_align/roi_align_autograd.cpp) ---------------------------------


def _fpn_levels_fake(rois, lowest_level, num_levels, canonical_size, canonical_level, eps):
    torch._check(rois.dim() == 2 and rois.shape[1] == 5, lambda: "rois must be (K, 5)")
    return rois.new_empty((rois.shape[0],), dtype=torch.int64)


def _multiscale_fake(features, rois, roi_levels, pooled_height, pooled_width, spatial_scales, sampling_ratio,
                     aligned, max_mode):
    return _pooled_fake(features[0], rois, pooled_height, pooled_width, max_mode)


def _multiscale_backward_fake(grad_output, rois, roi_levels, argmax, feature_shapes, spatial_scales, sampling_ratio,
                              aligned, max_mode):
    return [grad_output.new_empty(feature_shapes[i : i + 4]) for i in range(0, len(feature_shapes), 4)]


@on_load
def _register() -> None:
    torch.library.register_fake("yolo_fastdetect::fpn_levels")(_fpn_levels_fake)
    torch.library.register_fake("yolo_fastdetect::multiscale_roi_align")(_multiscale_fake)
    torch.library.register_fake("yolo_fastdetect::multiscale_roi_align_backward")(_multiscale_backward_fake)
