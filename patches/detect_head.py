"""Patch ``Detect._inference`` so the head decodes in the fused ``detect_decode`` operator.

Two layouts of the stock method exist, and the plan recognises which one the installed Ultralytics has:

- 8.4: ``_inference(x)`` takes the dict ``{"boxes", "scores", "feats"}`` of ``forward_head`` and decodes through
  ``_get_decode_boxes``.
- 8.3: ``_inference(x)`` takes the list of per-level maps ``(B, 4 * reg_max + nc, H, W)``, concatenates them and does
  the anchors, the DFL and ``decode_bboxes`` itself.

``Segment``, ``Pose``, ``v10Detect``, ``WorldDetect`` and ``YOLOEDetect`` reach the patched method through
``super()._inference`` or inheritance. The fast path keeps the stock contract: it returns the same
``(B, 4 + nc, A)`` tensor and still maintains ``self.anchors``, ``self.strides`` and ``self.shape`` (Pose's
keypoint decode and trackers read them). It falls back to the original method for export mode, for anything
that needs autograd, for heads that decode differently (``OBB``'s rotated boxes, a YOLOE prompt index) and for
inputs it does not recognise.
"""

from __future__ import annotations

import torch
from ultralytics.nn.modules import head as ultralytics_head
from ultralytics.nn.modules.head import Detect
from ultralytics.utils.tal import make_anchors

from yolo_fastdetect import _ext
from yolo_fastdetect.ops.detect_decode import detect_decode_reference

from ._patching import Patch, Replacement, parameters, require

# The 8.4 layout's _get_decode_boxes implementations whose result is exactly the stock anchor/DFL decode.
_STOCK_DECODERS = tuple(
    vars(cls)["_get_decode_boxes"]
    for cls in (Detect, getattr(ultralytics_head, "YOLOEDetect", Detect))
    if "_get_decode_boxes" in vars(cls)
)
_FAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _fast_path_applies(head: Detect, x: dict) -> bool:
    """Whether the fused decode reproduces ``head``'s stock ``_inference`` for these inputs."""
    boxes, scores, feats = x.get("boxes"), x.get("scores"), x.get("feats")
    if head.export or boxes is None or scores is None or not feats or "angle" in x or x.get("index") is not None:
        return False
    cls = type(head)
    decoder = getattr(cls, "_get_decode_boxes", None)  # the 8.4 layout's; the 8.3 layout decodes in _inference
    if cls.decode_bboxes is not Detect.decode_bboxes or (decoder is not None and decoder not in _STOCK_DECODERS):
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
    """``Detect._inference`` (8.4 layout) through the fused operator; the original method where that does not
    apply."""
    if not _fast_path_applies(self, x):
        return PATCH.original("_inference")(self, x)
    return _decode(self, x)


def fast_inference_levels(self: Detect, x: list[torch.Tensor]) -> torch.Tensor:
    """``Detect._inference`` (8.3 layout: the per-level maps) through the fused operator; the original method where
    that does not apply."""
    preds = _as_head_dict(self, x)
    if preds is None or not _fast_path_applies(self, preds):
        return PATCH.original("_inference")(self, x)
    return _decode(self, preds)


def _as_head_dict(head: Detect, x) -> dict | None:
    """The 8.3 layout's per-level maps as the 8.4 layout's dict (stock's own concatenation, then its box and class
    rows), or None where they are not ``nl`` maps of ``no`` channels."""
    if not isinstance(x, (list, tuple)) or not x or not all(isinstance(f, torch.Tensor) and f.dim() == 4 for f in x):
        return None
    if any(f.shape[1] != head.no for f in x):
        return None
    x_cat = torch.cat([f.view(f.shape[0], head.no, -1) for f in x], 2)
    boxes, scores = x_cat.split((head.reg_max * 4, head.nc), 1)
    return {"boxes": boxes, "scores": scores, "feats": list(x)}


def _decode(head: Detect, x: dict[str, torch.Tensor]) -> torch.Tensor:
    """The fused decode of the head dict, keeping the head's anchor state.

    On the GPU the DFL's expectation is the head's own ``dfl`` module, as in stock: its 1x1 convolution runs in cuDNN,
    which adds the 16 bins in an order of its own and, with torch's default ``cudnn.allow_tf32``, rounds its inputs to
    TF32 where its heuristics pick a tensor-core algorithm (batch by batch). No kernel can reproduce that choice, so
    the fused operator decodes the distances stock's convolution computed (``reg_max`` 1: the rest of the decode),
    which keeps the boxes stock's bit for bit in every precision and flag (RESULTS.md, "Parity in users' modes").
    """
    level_shapes, level_strides = _level_layout(head, x["feats"])
    xywh = not head.end2end and not getattr(head, "xyxy", False)  # as Detect.decode_bboxes (8.3.0 has no xyxy)
    boxes, reg_max = x["boxes"], head.reg_max
    if boxes.is_cuda and reg_max > 1:
        boxes, reg_max = head.dfl(boxes), 1
    return torch.ops.yolo_fastdetect.detect_decode(boxes, x["scores"], level_shapes, level_strides, reg_max, xywh)


fast_inference.__yolo_fastdetect__ = True
fast_inference_levels.__yolo_fastdetect__ = True


def _probe_matches_reference(probe_input) -> None:
    """Run stock ``Detect._inference`` on a tiny seeded head and check that it is the decode the operator computes
    (its pure-PyTorch reference): the layout and the math the patch replaces, not only the names."""
    torch_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        head = Detect(nc=2, ch=(8, 8)).eval()
        head.stride = torch.tensor([8.0, 16.0])
        maps = [torch.randn(1, head.no, 4, 6), torch.randn(1, head.no, 2, 3)]
    finally:
        torch.random.set_rng_state(torch_state)
    require(not head.end2end and head.reg_max == 16, "a default Detect is not a one-to-many DFL head")
    preds = _as_head_dict(head, maps)
    with torch.inference_mode():
        stock = Detect.__dict__["_inference"](head, probe_input(head, preds))
    expected = detect_decode_reference(preds["boxes"], preds["scores"], [[4, 6], [2, 3]], [8.0, 16.0], head.reg_max)
    require(isinstance(stock, torch.Tensor) and stock.shape == expected.shape,
            f"stock Detect._inference returns {type(stock).__name__} {tuple(getattr(stock, 'shape', ()))}, "
            f"not the decoded (B, 4 + nc, A) {tuple(expected.shape)}")
    require(torch.allclose(stock, expected, rtol=1e-4, atol=1e-3),
            "stock Detect._inference decodes differently from the fused operator on a probe")
    require(isinstance(head.anchors, torch.Tensor) and head.anchors.shape == (2, expected.shape[2]),
            "stock Detect._inference does not keep head.anchors (2, A)")


def _plan() -> list[Replacement]:
    """The replacement of ``Detect._inference`` for the layout the installed Ultralytics has (see the module
    docstring), after a probe of the stock method."""
    require("_inference" in vars(Detect), "Detect has no _inference of its own")
    require(parameters(Detect._inference) == ["self", "x"], "Detect._inference is not (self, x)")
    require({"bboxes", "anchors"} <= set(parameters(Detect.decode_bboxes)),
            "Detect.decode_bboxes does not take (bboxes, anchors)")
    if "_get_decode_boxes" in vars(Detect):  # 8.4: _inference(dict) -> _get_decode_boxes(dict)
        require(parameters(Detect._get_decode_boxes) == ["self", "x"], "Detect._get_decode_boxes is not (self, x)")
        _probe_matches_reference(lambda head, preds: preds)
        return [Replacement(Detect, "_inference", fast_inference)]
    _probe_matches_reference(lambda head, preds: preds["feats"])  # 8.3: the maps
    return [Replacement(Detect, "_inference", fast_inference_levels)]


PATCH = Patch(
    "detect_head",
    "Detect._inference(self, x) taking forward_head's dict (8.4) or the per-level maps (8.3), decoding with "
    "make_anchors, DFL and Detect.decode_bboxes(bboxes, anchors) as the fused operator does",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
