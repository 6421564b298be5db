"""Fused decode of the Ultralytics ``Detect`` head: ``yolo_fastdetect::detect_decode``.

Stock Ultralytics decodes in five to eight kernels (DFL softmax, DFL conv, anchor arithmetic, stride scale,
class sigmoid, concatenation). The operator does all of it in one pass over the head's box and class logits,
computing the anchor centres in the kernel from the level grid sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._ext import on_load, require

__all__ = ["detect_decode", "detect_decode_reference"]


def _flatten_level_shapes(level_shapes: Sequence[Sequence[int]]) -> list[int]:
    flat = []
    for shape in level_shapes:
        if len(shape) != 2:
            raise ValueError(f"level_shapes must be a sequence of (height, width) pairs, got {list(level_shapes)}")
        flat += [int(shape[0]), int(shape[1])]
    return flat


def detect_decode(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    level_shapes: Sequence[Sequence[int]],
    level_strides: Sequence[float],
    reg_max: int = 16,
    xywh: bool = True,
) -> torch.Tensor:
    """Decode the Detect head's raw outputs into boxes in input pixels and class probabilities.

    Args:
        boxes (torch.Tensor): Box logits ``(B, 4 * reg_max, A)``, channel ``side * reg_max + bin`` with sides
            left, top, right, bottom; the anchors of all levels concatenated, each level row-major.
        scores (torch.Tensor): Class logits ``(B, nc, A)``, same dtype and device as ``boxes``.
        level_shapes (Sequence[tuple[int, int]]): ``(height, width)`` of each level's grid, P3 first.
        level_strides (Sequence[float]): Input pixels per grid cell of each level, e.g. ``(8, 16, 32)``.
        reg_max (int): DFL bins per side: 16, or 1 when the head regresses distances directly (YOLO26).
        xywh (bool): Return ``cx, cy, w, h`` (Ultralytics' default) or ``x1, y1, x2, y2``.

    Returns:
        (torch.Tensor): ``(B, 4 + nc, A)`` in the dtype of ``boxes``: the box rows, then sigmoid class scores. Under
        ``torch.autocast`` the same: autocast casts neither input.

    Raises:
        RuntimeError: Gradients are wanted (inputs that require grad, grad mode on): the operator has no backward,
            and ``detect_decode_reference`` computes the same with autograd.

    Examples:
        >>> boxes, scores = torch.randn(1, 64, 8400), torch.randn(1, 80, 8400)
        >>> detect_decode(boxes, scores, [(80, 80), (40, 40), (20, 20)], [8, 16, 32]).shape
        torch.Size([1, 84, 8400])
    """
    if torch.is_grad_enabled() and (boxes.requires_grad or scores.requires_grad):
        raise RuntimeError(
            "detect_decode has no backward (boxes or scores require grad): call it under torch.no_grad(), or use "
            "detect_decode_reference, which autograd differentiates"
        )
    require()
    return torch.ops.yolo_fastdetect.detect_decode(
        boxes, scores, _flatten_level_shapes(level_shapes), [float(s) for s in level_strides], int(reg_max), bool(xywh)
    )


def _detect_decode_fake(boxes, scores, level_shapes, level_strides, reg_max, xywh):
    torch._check(boxes.dim() == 3 and scores.dim() == 3, lambda: "boxes and scores must be 3-D")
    torch._check(boxes.shape[1] == 4 * reg_max, lambda: "boxes must have 4*reg_max channels")
    return boxes.new_empty((boxes.shape[0], 4 + scores.shape[1], boxes.shape[2]))


@on_load
def _register() -> None:
    torch.library.register_fake("yolo_fastdetect::detect_decode")(_detect_decode_fake)


def detect_decode_reference(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    level_shapes: Sequence[Sequence[int]],
    level_strides: Sequence[float],
    reg_max: int = 16,
    xywh: bool = True,
) -> torch.Tensor:
    """Pure-PyTorch decode with the operator's signature, computed in the inputs' dtype (tests use float64).

    float16 and bfloat16 round where stock Ultralytics' decode rounds, which keeps every step in the features' dtype:
    the DFL softmax and its sum over the bins computed in float and each rounded once to the dtype, the anchors built
    in the dtype (as ``make_anchors``), then one PyTorch op per step of ``dist2bbox`` and the stride scale, each of
    which rounds its output.
    """
    dtype, device = boxes.dtype, boxes.device
    accumulate = torch.promote_types(dtype, torch.float32)  # float for half; the dtype itself otherwise
    batch, _, num_anchors = boxes.shape
    if reg_max > 1:
        bins = torch.arange(reg_max, dtype=accumulate, device=device).view(1, 1, reg_max, 1)
        probabilities = boxes.view(batch, 4, reg_max, num_anchors).to(accumulate).softmax(2).to(dtype)
        distance = (probabilities.to(accumulate) * bins).sum(2).to(dtype)
    else:
        distance = boxes
    centres, strides = [], []
    for (height, width), stride in zip(level_shapes, level_strides):
        ys, xs = torch.meshgrid(
            torch.arange(height, device=device).to(dtype) + 0.5,
            torch.arange(width, device=device).to(dtype) + 0.5,
            indexing="ij",
        )
        centres.append(torch.stack((xs.flatten(), ys.flatten())))
        strides.append(torch.full((height * width,), float(stride), dtype=dtype, device=device))
    centres, strides = torch.cat(centres, 1), torch.cat(strides)
    top_left, bottom_right = centres - distance[:, :2], centres + distance[:, 2:]
    if xywh:
        decoded = torch.cat(((top_left + bottom_right) / 2, bottom_right - top_left), 1)
    else:
        decoded = torch.cat((top_left, bottom_right), 1)
    return torch.cat((decoded * strides, scores.sigmoid()), 1)
