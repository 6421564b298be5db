"""Patch ``Detect._inference`` so the head decodes in the fused ``detect_decode`` operator.

``Segment``, ``Pose``, ``v10Detect``, ``WorldDetect`` and ``YOLOEDetect`` reach the patched method through
``super()._inference`` or inheritance. The fast path keeps the stock contract: it returns the same
``(B, 4 + nc, A)`` tensor and still maintains ``self.anchors``, ``self.strides`` and ``self.shape`` (Pose's
keypoint decode and trackers read them). It falls back to the original method for export mode, for anything
that needs autograd, for heads that decode differently (``OBB``'s rotated boxes, a YOLOE prompt index) and for
inputs it does not recognise.
"""

from __future__ import annotations

import torch
from ultralytics.nn.modules.head import Detect, YOLOEDetect
from ultralytics.utils.tal import make_anchors

from yolo_fastdetect import _ext

_ORIGINALS: dict[str, object] = {}

# _get_decode_boxes implementations whose result is exactly the stock anchor/DFL decode.
_STOCK_DECODERS = (Detect._get_decode_boxes, YOLOEDetect._get_decode_boxes)
_FAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _fast_path_applies(head: Detect, x: dict) -> bool:
    """Whether the fused decode reproduces ``head``'s stock ``_inference`` for these inputs."""
    boxes, scores, feats = x.get("boxes"), x.get("scores"), x.get("feats")
    if head.export or boxes is None or scores is None or not feats or "angle" in x or x.get("index") is not None:
        return False
    cls = type(head)
    if cls.decode_bboxes is not Detect.decode_bboxes or cls._get_decode_boxes not in _STOCK_DECODERS:
        return False
    if head.reg_max not in (1, 16) or boxes.dtype not in _FAST_DTYPES or scores.dtype != boxes.dtype:
        return False
    if torch.is_grad_enabled() and (boxes.requires_grad or scores.requires_grad):
        return False
    if boxes.device.type == "cuda":
        if not _ext.cuda_fast_path():
            return False
    elif boxes.device.type != "cpu" or not _ext.available():
        return False
    return len(feats) == len(head.stride) and boxes.shape[2] == sum(f.shape[2] * f.shape[3] for f in feats)


@torch.compiler.assume_constant_result
def _level_strides(stride: torch.Tensor) -> list[float]:
    """The head's level strides (``head.stride``, a tensor) as Python floats.

    Reading a tensor's values in traced code is a graph break (``.item()``). Marked as a constant result,
    torch.compile calls this once, eagerly, while it traces, and bakes the floats into the graph: the strides are
    fixed when the model is built."""
    return [float(s) for s in stride.tolist()]


def _level_layout(head: Detect, feats: list[torch.Tensor]) -> tuple[list[int], list[float]]:
    """Flattened ``[h0, w0, h1, w1, ...]`` and the level strides, keeping ``head.anchors``, ``head.strides`` and
    ``head.shape`` as stock's ``_get_decode_boxes`` does.

    Eagerly both are cached per input shape (reading the stride tensor from the GPU synchronises, so it happens
    when the anchors are rebuilt, not on every call). Under torch.compile the anchors are rebuilt on every call
    instead and no cache is read: a few fused arange kernels in the graph, where reading ``head.shape`` would
    guard on it, so that the shape's second call (``head.shape`` now set) recompiled the whole network."""
    level_shapes = [size for f in feats for size in f.shape[2:]]
    compiling = torch.compiler.is_compiling()
    cached = None if compiling else head.__dict__.get("_yolo_fastdetect_levels")
    if cached is None or cached[0] != level_shapes:
        cached = (level_shapes, _level_strides(head.stride))
        if not compiling:
            head._yolo_fastdetect_levels = cached
    shape = feats[0].shape
    if compiling or head.dynamic or head.shape != shape:
        # Python floats as the strides: make_anchors fills with them, where a tensor element is an .item() call.
        head.anchors, head.strides = (a.transpose(0, 1) for a in make_anchors(feats, cached[1], 0.5))
        head.shape = shape
    return cached


def fast_inference(self: Detect, x: dict[str, torch.Tensor]) -> torch.Tensor:
    """``Detect._inference`` through the fused operator; the original method where that does not apply."""
    if not _fast_path_applies(self, x):
        return _ORIGINALS["_inference"](self, x)
    level_shapes, level_strides = _level_layout(self, x["feats"])
    xywh = not self.end2end and not self.xyxy  # as Detect.decode_bboxes
    return torch.ops.yolo_fastdetect.detect_decode(
        x["boxes"], x["scores"], level_shapes, level_strides, self.reg_max, xywh
    )


fast_inference.__yolo_fastdetect__ = True


def apply() -> None:
    """Install the fused decode on ``Detect`` (idempotent)."""
    if not is_applied():
        _ORIGINALS["_inference"] = Detect.__dict__["_inference"]
        Detect._inference = fast_inference


def revert() -> None:
    """Restore the original ``Detect._inference`` (idempotent)."""
    if is_applied():
        Detect._inference = _ORIGINALS.pop("_inference")


def is_applied() -> bool:
    """Whether ``Detect._inference`` is the patched method."""
    return Detect.__dict__["_inference"] is fast_inference
