"""RoIAlign with mmcv's arguments: ``yolo_fastdetect::roi_align`` (CPU and CUDA, forward and backward).

Pools the features inside each region of interest into a fixed ``output_size`` grid, for second-stage heads
(re-identification embeddings, attribute classifiers, box refinement) on top of a detector. ``"avg"`` matches
``torchvision.ops.roi_align``; ``"max"`` keeps the largest bilinear sample of each bin, as mmcv does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .._ext import on_load, require

__all__ = ["RoIAlign", "boxes_to_rois", "roi_align", "roi_align_reference"]

POOL_MODES = ("avg", "max")
# As in the kernels (roi_align.h): the adaptive sampling grid is capped at this many points per bin side.
MAX_ADAPTIVE_GRID = 256


def _pair(output_size: int | Sequence[int]) -> tuple[int, int]:
    size = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    if len(size) != 2:
        raise ValueError(f"output_size must be an int or (height, width), got {output_size!r}")
    return int(size[0]), int(size[1])


def _is_max_mode(pool_mode: str) -> bool:
    if pool_mode not in POOL_MODES:
        raise ValueError(f"pool_mode must be one of {POOL_MODES}, got {pool_mode!r}")
    return pool_mode == "max"


def boxes_to_rois(rois: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """``(K, 5)`` ``[batch_index, x1, y1, x2, y2]`` rois from a list of per-image ``(L, 4)`` boxes (a tensor passes).

    Image ``i`` of the list gets batch index ``i``; an image may have no boxes.
    """
    if isinstance(rois, torch.Tensor):
        return rois
    image_boxes = list(rois)
    if not image_boxes:
        raise ValueError("rois: an empty list has no dtype or device; pass a (0, 5) tensor instead")
    for index, per_image in enumerate(image_boxes):
        if per_image.dim() != 2 or per_image.shape[1] != 4:
            raise ValueError(f"rois: image {index} boxes must be (L, 4) x1, y1, x2, y2, got {tuple(per_image.shape)}")
    # Two device kernels whatever the number of images (one concatenation of the boxes, one with the batch-index
    # column) and one host-to-device copy: the index column is built on the host from the list's lengths, without
    # waiting for the device. Under CUDA graph capture, where a copy from the host cannot be recorded, the column is
    # filled on the device instead, image by image.
    boxes = torch.cat(image_boxes)
    if boxes.is_cuda and torch.cuda.is_current_stream_capturing():
        batch_index = torch.cat(
            [torch.full((len(b),), i, dtype=boxes.dtype, device=boxes.device) for i, b in enumerate(image_boxes)]
        )
    else:
        # [0] * L_0 + [1] * L_1 + ...: repeat_interleave of the counts alone repeats each count's position.
        batch_index = torch.repeat_interleave(torch.tensor([len(b) for b in image_boxes])).to(boxes.dtype)
        batch_index = batch_index.to(boxes.device, non_blocking=True)
    return torch.cat((batch_index[:, None], boxes), 1)


def roi_align(
    input: torch.Tensor,
    rois: torch.Tensor | Sequence[torch.Tensor],
    output_size: int | Sequence[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = 0,
    pool_mode: str = "avg",
    aligned: bool = True,
) -> torch.Tensor:
    """Pool the features inside each RoI into an ``output_size`` grid (differentiable with respect to ``input``).

    Args:
        input (torch.Tensor): Features ``(N, C, H, W)``, float32/float16/bfloat16 (float64 too), any memory format.
        rois (torch.Tensor | Sequence[torch.Tensor]): ``(K, 5)`` ``[batch_index, x1, y1, x2, y2]`` in input-image
            pixels, or a list of ``N`` per-image ``(L, 4)`` boxes. Same dtype as ``input`` (float32 rois are also
            accepted with 16-bit features, which keeps box coordinates exact).
        output_size (int | tuple[int, int]): Pooled ``(height, width)``.
        spatial_scale (float): Feature pixels per input pixel, e.g. ``1 / 8`` for P3.
        sampling_ratio (int): Bilinear samples per bin side; ``<= 0`` takes ``ceil(bin size)`` (adaptive).
        pool_mode (str): ``"avg"`` (mean of the samples) or ``"max"`` (largest sample).
        aligned (bool): Shift box corners by half a pixel so that pixel centres sit at ``x + 0.5`` (Detectron2);
            ``False`` is the legacy convention (and makes RoIs at least one feature pixel wide).

    Returns:
        (torch.Tensor): ``(K, C, output_height, output_width)`` in ``input``'s dtype. A RoI whose batch index is not
        in ``[0, N)`` raises an IndexError (checked on the host; under CUDA graph capture it pools zeros instead).
        Under ``torch.autocast`` the operator runs in the dtype of ``input`` (autocast casts neither argument).

    Examples:
        >>> features = torch.randn(2, 256, 80, 80)  # P3 (stride 8) of two 640 x 640 images
        >>> boxes = [torch.tensor([[16.0, 32.0, 200.0, 300.0]]), torch.tensor([[0.0, 0.0, 64.0, 64.0]])]
        >>> roi_align(features, boxes, 7, spatial_scale=1 / 8, sampling_ratio=2).shape
        torch.Size([2, 256, 7, 7])
    """
    pooled_height, pooled_width = _pair(output_size)
    max_mode = _is_max_mode(pool_mode)
    require()
    output, _ = torch.ops.yolo_fastdetect.roi_align.default(
        input, boxes_to_rois(rois), pooled_height, pooled_width, float(spatial_scale), int(sampling_ratio),
        bool(aligned), max_mode,
    )
    return output


class RoIAlign(nn.Module):
    """``nn.Module`` form of :func:`roi_align`, with mmcv's ``RoIAlign`` arguments and defaults.

    Examples:
        >>> pool = RoIAlign(7, spatial_scale=1 / 8, pool_mode="max")
        >>> pool(torch.randn(1, 64, 80, 80), torch.tensor([[0.0, 16.0, 32.0, 200.0, 300.0]])).shape
        torch.Size([1, 64, 7, 7])
    """

    def __init__(
        self,
        output_size: int | Sequence[int],
        spatial_scale: float = 1.0,
        sampling_ratio: int = 0,
        pool_mode: str = "avg",
        aligned: bool = True,
    ) -> None:
        super().__init__()
        self.output_size = _pair(output_size)
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = int(sampling_ratio)
        _is_max_mode(pool_mode)
        self.pool_mode = pool_mode
        self.aligned = bool(aligned)

    def forward(self, input: torch.Tensor, rois: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """Pool ``input`` (N, C, H, W) inside ``rois`` ((K, 5) or a list of per-image (L, 4) boxes)."""
        return roi_align(
            input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.pool_mode, self.aligned
        )

    def extra_repr(self) -> str:
        return (
            f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
            f"sampling_ratio={self.sampling_ratio}, pool_mode={self.pool_mode!r}, aligned={self.aligned}"
        )


# Fake kernels (autograd is registered in C++, csrc/roi_align/roi_align_autograd.cpp) ---------------------------------


def _pooled_fake(features, rois, pooled_height, pooled_width, max_mode):
    torch._check(rois.dim() == 2 and rois.shape[1] == 5, lambda: "rois must be (K, 5)")
    shape = (rois.shape[0], features.shape[1], pooled_height, pooled_width)
    argmax = features.new_empty(shape if max_mode else (0,), dtype=torch.int32)
    return features.new_empty(shape), argmax


def _roi_align_fake(input, rois, pooled_height, pooled_width, spatial_scale, sampling_ratio, aligned, max_mode):
    return _pooled_fake(input, rois, pooled_height, pooled_width, max_mode)


def _roi_align_backward_fake(grad_output, rois, argmax, input_shape, spatial_scale, sampling_ratio, aligned, max_mode):
    return grad_output.new_empty(input_shape)


@on_load
def _register() -> None:
    torch.library.register_fake("yolo_fastdetect::roi_align")(_roi_align_fake)
    torch.library.register_fake("yolo_fastdetect::roi_align_backward")(_roi_align_backward_fake)


# Reference ------------------------------------------------------------------------------------------------------


def _axis_taps(coordinate: torch.Tensor, size: int):
    """Bilinear taps along one axis as in the kernels: (valid, low, high, weight_low, weight_high)."""
    valid = (coordinate >= -1) & (coordinate <= size)
    coordinate = coordinate.clamp(min=0)
    low = coordinate.floor().long()
    at_edge = low >= size - 1
    low = torch.where(at_edge, size - 1, low).clamp(0, size - 1)
    high = torch.where(at_edge, low, low + 1).clamp(0, size - 1)
    fraction = torch.where(at_edge, torch.zeros_like(coordinate), coordinate - low.to(coordinate.dtype))
    return valid, low, high, 1 - fraction, fraction


def _bilinear(image: torch.Tensor, ys: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """Sample ``image`` (C, H, W) at every (ys[i], xs[j]) -> (C, len(ys), len(xs)); zero outside the map."""
    _, height, width = image.shape
    valid_y, y_low, y_high, wy_low, wy_high = _axis_taps(ys, height)
    valid_x, x_low, x_high, wx_low, wx_high = _axis_taps(xs, width)
    rows_low, rows_high = image[:, y_low], image[:, y_high]
    values = (
        rows_low[:, :, x_low] * (wy_low[:, None] * wx_low[None, :])
        + rows_low[:, :, x_high] * (wy_low[:, None] * wx_high[None, :])
        + rows_high[:, :, x_low] * (wy_high[:, None] * wx_low[None, :])
        + rows_high[:, :, x_high] * (wy_high[:, None] * wx_high[None, :])
    )
    return values * (valid_y[:, None] & valid_x[None, :])


def roi_align_reference(
    input: torch.Tensor,
    rois: torch.Tensor | Sequence[torch.Tensor],
    output_size: int | Sequence[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = 0,
    pool_mode: str = "avg",
    aligned: bool = True,
) -> torch.Tensor:
    """Pure-PyTorch :func:`roi_align`, one RoI at a time in ``input``'s dtype (tests use float64).

    Differentiable through ordinary autograd, so it is also the reference for the gradients. RoIs with a batch
    index outside ``[0, N)`` pool zeros.
    """
    pooled_height, pooled_width = _pair(output_size)
    max_mode = _is_max_mode(pool_mode)
    rois = boxes_to_rois(rois)
    batch, channels, height, width = input.shape
    outputs = []
    for roi in rois.tolist():
        batch_index, coordinates = roi[0], roi[1:]
        offset = 0.5 if aligned else 0.0
        x1, y1, x2, y2 = (value * spatial_scale - offset for value in coordinates)
        roi_width, roi_height = x2 - x1, y2 - y1
        if not aligned:
            roi_width, roi_height = max(roi_width, 1.0), max(roi_height, 1.0)
        bin_height, bin_width = roi_height / pooled_height, roi_width / pooled_width
        if sampling_ratio > 0:
            grid_h = grid_w = sampling_ratio
        else:
            grid_h, grid_w = (min(max(math.ceil(size), 0), MAX_ADAPTIVE_GRID) for size in (bin_height, bin_width))
        if not 0 <= batch_index < batch or grid_h == 0 or grid_w == 0:
            outputs.append(input.new_zeros((channels, pooled_height, pooled_width)))
            continue

        def sample_coordinates(start, bin_size, bins, grid):
            bin_index = torch.arange(bins, dtype=input.dtype, device=input.device)[:, None]
            sample_index = torch.arange(grid, dtype=input.dtype, device=input.device)[None, :]
            return (start + bin_index * bin_size + (sample_index + 0.5) * bin_size / grid).flatten()

        ys = sample_coordinates(y1, bin_height, pooled_height, grid_h)
        xs = sample_coordinates(x1, bin_width, pooled_width, grid_w)
        samples = _bilinear(input[int(batch_index)], ys, xs).view(channels, pooled_height, grid_h, pooled_width, grid_w)
        if max_mode:  # the first largest sample (row-major in the bin's grid), as the kernels' argmax: its gradient
            # goes to that one sample, where amax would split it between equal samples
            grid = samples.permute(0, 1, 3, 2, 4).reshape(channels, pooled_height, pooled_width, grid_h * grid_w)
            outputs.append(grid.gather(-1, grid.argmax(-1, keepdim=True)).squeeze(-1))
        else:
            outputs.append(samples.mean((2, 4)))
    if not outputs:
        return input.new_zeros((0, channels, pooled_height, pooled_width))
    return torch.stack(outputs)
