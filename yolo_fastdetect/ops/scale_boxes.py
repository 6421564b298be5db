"""Boxes from the model input back to the original images, for a whole batch at once, as Ultralytics'
``ops.scale_boxes`` maps them image by image.

Stock ``scale_boxes`` runs twelve tensor operations per image (four subtractions of the padding, four divisions by
the gain, four clamps), each a kernel launch on a GPU: 0.15 ms of host time an image, most of the package's
post-processing at batch 64 on the H200 (``bench e2e``, 590964d). Here a batch takes one upload of a per-image table
and three operations, with stock's arithmetic: ``x - pad``, then the division by the gain as PyTorch computes a
division by a Python scalar on that device (on CUDA a multiplication by the float32 reciprocal, on the CPU a
float32 division), then the clamp to the image. The results are bit-identical to stock's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .letterbox import LetterboxGeometry

__all__ = ["scale_boxes_batch", "scale_boxes_in_place"]


def _scaling_table(geometries: Sequence[LetterboxGeometry], xywh: bool, reciprocal: bool) -> np.ndarray:
    """Per image, float32 rows: the padding to subtract, the gain to divide by (or its reciprocal to multiply by),
    and the clamp's lower and upper bounds, each for the columns ``x1, y1, x2, y2`` (``x, y, w, h``)."""
    table = np.zeros((len(geometries), 4, 4), dtype=np.float32)
    for image, geometry in enumerate(geometries):
        (gain_y, gain_x), (pad_x, pad_y) = geometry.ratio_pad
        height, width = geometry.orig_shape
        table[image, 0] = (pad_x, pad_y, 0, 0) if xywh else (pad_x, pad_y, pad_x, pad_y)
        gains = np.array((gain_x, gain_y, gain_x, gain_y), dtype=np.float32)  # the scalar as float32, as torch does
        table[image, 1] = np.float32(1) / gains if reciprocal else gains
        table[image, 3] = (width, height, width, height)
    return table


def scale_boxes_in_place(boxes: torch.Tensor, geometries: Sequence[LetterboxGeometry], xywh: bool = False) -> None:
    """Map the first four columns of ``(B, N, C)`` float32 ``boxes`` back to each image's original pixels, in place
    (see :func:`scale_boxes_batch`).

    Examples:
        >>> from yolo_fastdetect import letterbox_geometry
        >>> boxes = torch.tensor([[[0.0, 80.0, 640.0, 560.0, 0.9, 0.0]]])
        >>> scale_boxes_in_place(boxes, [letterbox_geometry((720, 1280), (640, 640))])
        >>> boxes[0, 0, :4].tolist()
        [0.0, 0.0, 1280.0, 720.0]
    """
    table = torch.from_numpy(_scaling_table(geometries, xywh, reciprocal=boxes.is_cuda)).to(boxes.device)
    coordinates = boxes[..., :4]
    coordinates.sub_(table[:, None, 0])
    coordinates.mul_(table[:, None, 1]) if boxes.is_cuda else coordinates.div_(table[:, None, 1])
    if not xywh:
        coordinates.clamp_(min=table[:, None, 2], max=table[:, None, 3])


def scale_boxes_batch(
    boxes: torch.Tensor, geometries: Sequence[LetterboxGeometry], xywh: bool = False
) -> torch.Tensor:
    """Map boxes from the model input back to each original image, on the boxes' device.

    Matches ``ultralytics.utils.ops.scale_boxes(img.shape[2:], boxes, orig_shape)`` as the predictor calls it
    (``ratio_pad=geometry.ratio_pad`` for a padding that is not centred), bit for bit for float32 boxes: subtract
    the padding, divide by the per-axis gain, and for ``xyxy`` clip to the original image.

    Args:
        boxes (torch.Tensor): ``(B, N, C)`` with ``C >= 4``, the first four columns ``x1, y1, x2, y2`` (or
            ``x, y, w, h``), e.g. the fixed-size detections of :func:`batched_nms`; other columns are kept.
        geometries (Sequence[LetterboxGeometry]): One per batch image, from :func:`letterbox` (or
            :func:`letterbox_geometry` of the original shape and the model input's).
        xywh (bool): Boxes are ``x, y, w, h`` (shifted and scaled, not clipped).

    Returns:
        (torch.Tensor): A new tensor like ``boxes`` with the first four columns in original-image pixels.

    Raises:
        ValueError: ``boxes`` is not ``(B, N, >=4)``, or there is not one geometry per image.

    Examples:
        >>> from yolo_fastdetect import letterbox_geometry
        >>> geometry = letterbox_geometry((1080, 810), 640)  # resized to 640 x 480, 80 columns of padding each side
        >>> scale_boxes_batch(torch.tensor([[[80.0, 0.0, 560.0, 640.0]]]), [geometry])[0, 0].tolist()
        [0.0, 0.0, 810.0, 1080.0]
    """
    if boxes.dim() != 3 or boxes.shape[2] < 4:
        raise ValueError(f"scale_boxes_batch: boxes must be (B, N, >=4), got {tuple(boxes.shape)}")
    if len(geometries) != boxes.shape[0]:
        raise ValueError(f"scale_boxes_batch: {len(geometries)} geometries for a batch of {boxes.shape[0]}")
    scaled = boxes.clone()
    scale_boxes_in_place(scaled, geometries, xywh)
    return scaled
