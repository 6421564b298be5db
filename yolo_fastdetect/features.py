"""Pooled features per detection, for second-stage heads on top of an Ultralytics detector.

Usage::

    model = YOLO("yolo11n.pt")
    capture = yolo_fastdetect.capture_head_inputs(model)   # once, before predicting
    results = model.predict(images, batch=len(images))
    pooled = yolo_fastdetect.roi_features(model, results)  # one (n_i, C3 + C4 + C5, 7, 7) tensor per image

``capture_head_inputs`` puts a forward pre-hook on the model's ``Detect`` head that keeps the P3/P4/P5 maps of
the last forward pass. ``roi_features`` maps each ``Results``' boxes from original-image pixels back onto the
letterboxed input the head saw (the inverse of Ultralytics' ``scale_boxes``) and pools every box from every level
with RoIAlign. YOLO's levels have different widths, so the levels are concatenated along channels rather than
one level being chosen per box (the FPN rule of :class:`~yolo_fastdetect.ops.MultiScaleRoIAlign` needs equal widths).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .ops.letterbox import letterbox_geometry
from .ops.roi_align import roi_align

__all__ = ["HeadCapture", "capture_head_inputs", "detection_rois", "roi_features"]


@dataclass
class HeadCapture:
    """The inputs of the ``Detect`` head in the last forward pass of a captured model."""

    features: list[torch.Tensor] | None = None  # P3, P4, P5, ... as (B, C_l, H_l, W_l), detached
    strides: torch.Tensor | None = None  # the head's stride per level (input pixels per feature pixel)
    handles: list = field(default_factory=list)

    @property
    def input_shape(self) -> tuple[int, int]:
        """``(height, width)`` of the letterboxed model input of the last forward pass."""
        if self.features is None:
            raise RuntimeError("no forward pass captured yet: predict after capture_head_inputs(model)")
        height, width = self.features[0].shape[2:]
        stride = int(self.strides[0])
        return int(height) * stride, int(width) * stride

    def remove(self) -> None:
        """Remove the hooks this capture installed (copies the predictor made earlier keep theirs)."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def _detect_heads(model_or_predictor) -> list[nn.Module]:
    """Every ``Detect`` head reachable from a ``YOLO`` model, a predictor or an ``nn.Module``.

    Follows ``.predictor`` and ``.model`` links: a ``YOLO`` object's predictor holds its own deep copy of the
    network, behind ``AutoBackend`` (whose ``.model`` is the network).
    """
    from ultralytics.nn.modules.head import Detect

    roots, pending = [], [model_or_predictor, getattr(model_or_predictor, "predictor", None)]
    while pending:
        root = pending.pop()
        if root is not None and not any(root is seen for seen in roots):
            roots.append(root)
            pending.append(getattr(root, "model", None))
    heads = []
    for root in roots:
        if isinstance(root, nn.Module):
            heads += [module for module in root.modules() if isinstance(module, Detect) and module not in heads]
    return heads


def _find_capture(model_or_predictor) -> HeadCapture | None:
    for head in _detect_heads(model_or_predictor):
        for hook in head._forward_pre_hooks.values():
            capture = getattr(hook, "yolo_fastdetect_capture", None)
            if capture is not None:
                return capture
    return None


def capture_head_inputs(model_or_predictor) -> HeadCapture:
    """Keep the feature maps entering the ``Detect`` head on every forward pass (idempotent).

    Call it before the first ``predict``: the predictor deep-copies the network, and the copy keeps the hook
    (a plain function, which ``deepcopy`` shares), so it reports to the same :class:`HeadCapture`.
    """
    capture = _find_capture(model_or_predictor)
    if capture is not None:
        return capture
    heads = _detect_heads(model_or_predictor)
    if not heads:
        raise ValueError(f"no Ultralytics Detect head found in {type(model_or_predictor).__name__}")
    capture = HeadCapture()

    def keep_head_inputs(head: nn.Module, args: tuple) -> None:
        capture.features = [feature.detach() for feature in args[0][: head.nl]]
        capture.strides = head.stride  # read on the host only when pooling

    keep_head_inputs.yolo_fastdetect_capture = capture
    capture.handles = [head.register_forward_pre_hook(keep_head_inputs) for head in heads]
    return capture


def detection_rois(results: Sequence, input_shape: tuple[int, int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(K, 5)`` ``[image_index, x1, y1, x2, y2]`` of every box in ``results``, in letterboxed input pixels.

    Inverts ``ultralytics.utils.ops.scale_boxes`` (same gain, rounding and padding as ``LetterBox``), which mapped
    the boxes from the ``input_shape`` letterbox to each image's original shape.
    """
    rois = []
    for index, result in enumerate(results):
        # The predictor letterboxed each image into input_shape: its placement there is LetterBox's geometry.
        (gain_y, gain_x), (pad_x, pad_y) = letterbox_geometry(result.orig_shape, input_shape).ratio_pad
        boxes = result.boxes.xyxy.to(dtype)
        letterboxed = boxes * boxes.new_tensor([gain_x, gain_y] * 2) + boxes.new_tensor([pad_x, pad_y] * 2)
        rois.append(torch.cat((boxes.new_full((len(boxes), 1), index), letterboxed), 1))
    return torch.cat(rois) if rois else torch.zeros((0, 5), dtype=dtype)


def roi_features(
    model_or_predictor,
    results: Sequence,
    output_size: int | Sequence[int] = 7,
    sampling_ratio: int = 0,
    aligned: bool = True,
) -> list[torch.Tensor]:
    """RoIAlign features of every detected box, pooled from the maps the head saw in the last prediction.

    Args:
        model_or_predictor: The ``YOLO`` model (or predictor, or network) passed to :func:`capture_head_inputs`.
        results (Sequence[Results]): The ``Results`` of that prediction, one per image of the batch.
        output_size (int | tuple[int, int]): Pooled size per box.
        sampling_ratio (int), aligned (bool): As :func:`~yolo_fastdetect.ops.roi_align`.

    Returns:
        (list[torch.Tensor]): Per image, ``(n_i, C3 + C4 + C5, out_h, out_w)`` on the features' device and dtype,
        the levels concatenated along channels, box ``j`` in ``results[i].boxes[j]``'s order.
    """
    capture = _find_capture(model_or_predictor)
    if capture is None or capture.features is None:
        raise RuntimeError("roi_features: call yolo_fastdetect.capture_head_inputs(model) before predicting")
    features = capture.features
    if len(results) != features[0].shape[0]:
        raise ValueError(
            f"roi_features: the last forward pass had a batch of {features[0].shape[0]} images but {len(results)} "
            "results were given; pass the results of that batch (predict(..., batch=len(images)))"
        )
    # 16-bit features keep float32 boxes: float16 cannot hold pixel coordinates above 1024 exactly.
    box_dtype = torch.float64 if features[0].dtype == torch.float64 else torch.float32
    rois = detection_rois(results, capture.input_shape, box_dtype).to(features[0].device)
    # Captured under torch.inference_mode(); a clone outside it gives ordinary tensors autograd may use.
    maps = [feature.clone() if feature.is_inference() else feature for feature in features]
    pooled = torch.cat(
        [
            roi_align(feature, rois, output_size, 1.0 / stride, sampling_ratio, "avg", aligned)
            for feature, stride in zip(maps, capture.strides.tolist())
        ],
        1,
    )
    return list(pooled.split([len(result.boxes) for result in results]))
