"""Batched NMS of the Detect head's output: ``yolo_fastdetect::batched_nms`` and a drop-in for Ultralytics'.

Stock ``ultralytics.utils.nms.non_max_suppression`` loops over the images in Python and synchronises with the
host at every step. The operator processes the whole batch at once (on the GPU: candidate selection, a segmented
sort and a tiled greedy suppression, with no host synchronisation) and returns fixed-size padded tensors;
:func:`non_max_suppression` splits them into the stock list of per-image tensors with one copy of the counts
to the host: a :class:`BatchDetections`, whose items are views of the padded tensor that it also carries, for a
next layer that works on all the images at once.
"""

from __future__ import annotations

import importlib
import inspect
import operator
import struct
import sys
from collections.abc import Sequence

import torch

from .._ext import available, cuda_fast_path, on_load, require


def _stock_function():
    """Ultralytics' ``non_max_suppression`` where its predictors call it: ``ultralytics.utils.nms`` (8.3.200 on),
    else ``ultralytics.utils.ops`` (to 8.3.100); None without Ultralytics. The operator works without it; only the
    drop-in's fall-backs need it."""
    for module in ("ultralytics.utils.nms", "ultralytics.utils.ops"):
        try:
            function = getattr(importlib.import_module(module), "non_max_suppression", None)
        except Exception:  # noqa: BLE001 - absent or broken: the drop-in then has no stock to fall back on
            continue
        if function is not None:
            return function
    return None


stock_non_max_suppression = _stock_function()  # captured at import, before any patch replaces the module attribute

__all__ = ["BatchDetections", "batched_nms", "counts_and_nonfinite_flag", "image_rows", "non_max_suppression",
           "non_max_suppression_reference", "operator_arguments"]

_FAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_CLASS_FILTER = 64  # kMaxClassFilter in csrc/nms/nms.h


def batched_nms(
    prediction: torch.Tensor,
    num_classes: int,
    conf_thres: float = 0.25,
    iou_thres: float = 0.45,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    multi_label: bool = False,
    max_det: int = 300,
    max_nms: int = 30000,
    max_wh: float = 7680,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run Ultralytics' NMS on a whole batch, returning fixed-size padded tensors.

    Args:
        prediction (torch.Tensor): ``(B, 4 + num_classes + nm, A)``: ``cx, cy, w, h`` rows, class scores, then
            ``nm`` extra channels; float32, float16 or bfloat16.
        num_classes (int): Number of class rows after the box rows.
        conf_thres (float): Minimum score (exclusive), in [0, 1].
        iou_thres (float): IoU (exclusive) above which a lower-scored box is suppressed, in [0, 1]. Compared in
            double on the CPU (as torchvision's CPU kernel) and in float32 on the GPU.
        classes (Sequence[int] | None): Keep only these classes (at most 64); None keeps all.
        agnostic (bool): Suppress across classes.
        multi_label (bool): One candidate per class above ``conf_thres`` instead of the best class only.
        max_det (int): Detections kept per image.
        max_nms (int): Highest-scored candidates per image that enter the suppression.
        max_wh (float): Per-class box offset separating the classes.

    Returns:
        (tuple[torch.Tensor, torch.Tensor, torch.Tensor]): ``detections (B, max_det, 6 + nm)`` float32 rows
            ``[x1, y1, x2, y2, score, class, extras...]`` in descending score, zero-padded; ``counts (B,)`` int64;
            ``anchor_indices (B, max_det)`` int64, -1 where padded. Under ``torch.autocast`` the same: autocast does
            not cast ``prediction``.

    Examples:
        >>> scale = torch.tensor([640.0, 640.0, 64.0, 64.0] + [1.0] * 80).view(1, -1, 1)
        >>> prediction = torch.rand(2, 4 + 80, 8400) * scale  # cx, cy, w, h in pixels, then 80 class scores
        >>> detections, counts, anchor_indices = batched_nms(prediction, num_classes=80, max_det=100)
        >>> detections.shape, counts.shape, anchor_indices.shape
        (torch.Size([2, 100, 6]), torch.Size([2]), torch.Size([2, 100]))
    """
    require()
    return torch.ops.yolo_fastdetect.batched_nms(
        prediction,
        int(num_classes),
        float(conf_thres),
        float(iou_thres),
        None if classes is None else [int(c) for c in classes],
        bool(agnostic),
        bool(multi_label),
        int(max_det),
        int(max_nms),
        float(max_wh),
    )


def _batched_nms_fake(prediction, num_classes, conf_thres, iou_thres, classes, agnostic, multi_label, max_det,
                      max_nms, max_wh):
    torch._check(prediction.dim() == 3, lambda: "prediction must be (B, 4 + nc + nm, A)")
    batch, channels = prediction.shape[0], prediction.shape[1]
    return (
        prediction.new_empty((batch, max_det, 2 + channels - num_classes), dtype=torch.float32),
        prediction.new_empty((batch,), dtype=torch.long),
        prediction.new_empty((batch, max_det), dtype=torch.long),
    )


@on_load
def _register() -> None:
    torch.library.register_fake("yolo_fastdetect::batched_nms")(_batched_nms_fake)


def _class_filter(classes) -> list[int] | None:
    """``classes`` as distinct ints, or None when stock would compare it some other way (floats, tensors)."""
    try:
        values = [classes] if isinstance(classes, int) else list(classes)
        return sorted({operator.index(c) for c in values})
    except TypeError:
        return None


def _fast_path_applies(prediction, classes) -> bool:
    """Whether the operator reproduces the stock function for this input."""
    if not isinstance(prediction, torch.Tensor) or prediction.dim() != 3 or prediction.dtype not in _FAST_DTYPES:
        return False
    if prediction.shape[-1] == 6:  # stock reads a last dimension of 6 as end-to-end output
        return False
    if torch.is_grad_enabled() and prediction.requires_grad:
        return False
    if classes is not None:
        class_filter = _class_filter(classes)
        if class_filter is None or len(class_filter) > _MAX_CLASS_FILTER:
            return False
    if prediction.device.type == "cuda":
        return cuda_fast_path()
    return prediction.device.type == "cpu" and available()


def _stock_iou_threshold(iou_thres: float, device: torch.device) -> float:
    """The IoU threshold as the stock path compares it: torchvision's CPU kernel in double, Ultralytics'
    TorchNMS (used while torchvision is not imported) and the CUDA kernels in float32."""
    if device.type == "cpu" and "torchvision" in sys.modules:
        return float(iou_thres)
    return struct.unpack("f", struct.pack("f", iou_thres))[0]


def _stock(arguments: dict):
    """The stock function on ``arguments``, by name, leaving out those at their default that this release's stock
    function does not take (8.3.0 has no ``end2end`` or ``return_idxs``)."""
    accepted = inspect.signature(stock_non_max_suppression).parameters
    return stock_non_max_suppression(**{name: value for name, value in arguments.items()
                                        if name in accepted or value != _DEFAULTS[name]})


def non_max_suppression(
    prediction,
    conf_thres: float = 0.25,
    iou_thres: float = 0.45,
    classes=None,
    agnostic: bool = False,
    multi_label: bool = False,
    max_det: int = 300,
    nc: int = 0,
    max_time_img: float = 0.05,
    max_nms: int = 30000,
    max_wh: int = 7680,
    rotated: bool = False,
    end2end: bool = False,
    return_idxs: bool = False,
):
    """Drop-in for ``ultralytics.utils.nms.non_max_suppression`` (8.4) with the same arguments and results.

    Float32/16 and bfloat16 predictions on the CPU or a GPU run through ``batched_nms``; rotated (OBB) and
    end-to-end predictions, and anything else the operator does not cover, go to the stock function.
    ``max_time_img`` is accepted for compatibility: the operator has no time limit.

    Returns:
        (list[torch.Tensor] | tuple[list[torch.Tensor], list[torch.Tensor]]): Per image a float32
            ``(n, 6 + nm)`` tensor ``[x1, y1, x2, y2, conf, cls, extras...]`` in descending confidence (from the
            operator, a :class:`BatchDetections`); with ``return_idxs`` also per image the kept anchors' indices
            (int64, or an empty ``(0, 1)`` float tensor where nothing is kept, as stock).

    Raises:
        ValueError: ``conf_thres`` or ``iou_thres`` outside [0, 1], ``max_det`` below 1, or ``prediction`` not
            3-D (stock raises AssertionError or an indexing error for these).

    Examples:
        >>> scale = torch.tensor([640.0, 640.0, 64.0, 64.0] + [1.0] * 80).view(1, -1, 1)
        >>> output = non_max_suppression(torch.rand(2, 4 + 80, 8400) * scale, conf_thres=0.5, max_det=100)
        >>> len(output), output[0].shape[1]  # per image (n, 6): x1, y1, x2, y2, conf, cls
        (2, 6)
    """
    stock_args = {"prediction": prediction, "conf_thres": conf_thres, "iou_thres": iou_thres, "classes": classes,
                  "agnostic": agnostic, "multi_label": multi_label, "max_det": max_det, "nc": nc,
                  "max_time_img": max_time_img, "max_nms": max_nms, "max_wh": max_wh, "rotated": rotated,
                  "end2end": end2end, "return_idxs": return_idxs}
    if isinstance(prediction, (list, tuple)):  # validation mode: (inference output, loss output)
        prediction = prediction[0]
    if rotated or end2end:
        return _stock(stock_args)
    arguments = operator_arguments(prediction, conf_thres, iou_thres, classes, agnostic, multi_label, max_det, nc,
                                   max_nms, max_wh)
    if arguments is None:
        return _stock(stock_args)
    detections, counts, anchor_indices = batched_nms(prediction, *arguments)
    *counts, nonfinite = counts_and_nonfinite_flag(counts, prediction).tolist()  # the one copy to the host
    if nonfinite:
        return _stock(stock_args)
    output = BatchDetections(detections, counts)
    if not return_idxs:
        return output
    # Stock leaves an empty image's indices as its (0, 1) float placeholder.
    keepi = [
        indices[:count] if count else torch.zeros((0, 1), device=prediction.device)
        for indices, count in zip(anchor_indices.unbind(0), counts)
    ]
    return output, keepi


_DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(non_max_suppression).parameters.items()}


def operator_arguments(prediction, conf_thres: float, iou_thres: float, classes, agnostic: bool, multi_label: bool,
                       max_det: int, nc: int, max_nms: int, max_wh: float) -> tuple | None:
    """The arguments after ``prediction`` with which :func:`batched_nms` reproduces the stock function's call with
    these (a single ``prediction`` tensor, neither rotated nor end-to-end), or None where the stock function must run.

    Raises:
        ValueError: ``conf_thres`` or ``iou_thres`` outside [0, 1], ``max_det`` below 1, or ``prediction`` not 3-D.
    """
    if not 0 <= conf_thres <= 1:
        raise ValueError(f"conf_thres must be in [0, 1], got {conf_thres}")
    if not 0 <= iou_thres <= 1:
        raise ValueError(f"iou_thres must be in [0, 1], got {iou_thres}")
    if max_det < 1:
        raise ValueError(f"max_det must be at least 1, got {max_det}")
    if isinstance(prediction, torch.Tensor) and prediction.dim() != 3:
        raise ValueError(f"prediction must be (batch, 4 + nc + extra, anchors), got shape {tuple(prediction.shape)}")
    if max_nms < 1 or not _fast_path_applies(prediction, classes):  # stock slices [:max_nms]: 0 keeps none
        return None
    num_classes = nc or prediction.shape[1] - 4
    # No image keeps more than max_nms candidates or more than it has: the padded output is allocated for what can
    # exist, not for a max_det of 10**9 (which would exhaust memory, where stock returns what there is).
    candidates = prediction.shape[2] * (num_classes if multi_label and num_classes > 1 else 1)
    return (
        num_classes,
        float(conf_thres),
        _stock_iou_threshold(iou_thres, prediction.device),
        None if classes is None else tuple(_class_filter(classes)),
        bool(agnostic),
        bool(multi_label),
        max(1, min(int(max_det), int(max_nms), candidates)),
        int(max_nms),
        float(max_wh),
    )


def counts_and_nonfinite_flag(counts: torch.Tensor, prediction: torch.Tensor) -> torch.Tensor:
    """``batched_nms``'s ``counts`` followed by 1 where a box coordinate of the batch is NaN or infinite (else 0), so
    that one copy to the host brings both.

    Such boxes take whatever path torchvision's NMS kernels give them (it differs by device), so a batch with one
    goes to the stock function."""
    return torch.cat((counts, (~torch.isfinite(prediction[:, :4])).any().view(1).to(counts.dtype)))


def image_rows(detections: torch.Tensor, counts: list[int]) -> list[torch.Tensor]:
    """Each image's kept rows of the padded ``detections``, as the stock function's list (views, no copy)."""
    return [rows[:count] for rows, count in zip(detections.unbind(0), counts)]


class BatchDetections(list):
    """:func:`non_max_suppression`'s result: the stock function's list, per image its kept rows, which are the first
    rows of that image in one padded ``(B, max_det, 6 + nm)`` tensor (:func:`batched_nms`'s ``detections``), carried
    as :attr:`padded` for a next layer that works on every image at once (the results patch scales the boxes there).

    Stock code takes it as the list it is; a copy, a pickle or a slice is a plain list of the same tensors.

    Args:
        padded (torch.Tensor): ``(B, max_det, 6 + nm)`` detections, zero-padded after each image's ``counts[i]``.
        counts (Sequence[int]): Each image's kept rows.

    Examples:
        >>> detections, counts, _ = batched_nms(torch.rand(2, 4 + 80, 8400) * 640, num_classes=80, max_det=100)
        >>> rows = BatchDetections(detections, counts.tolist())
        >>> rows.padded_rows() is detections, [len(r) for r in rows] == counts.tolist()
        (True, True)
    """

    def __init__(self, padded: torch.Tensor, counts: Sequence[int]):
        super().__init__(image_rows(padded, counts))
        self.padded = padded
        self._rows = tuple(self)

    def padded_rows(self) -> torch.Tensor | None:
        """:attr:`padded` while the list still holds the rows it was made with (each image's tensor, in order); None
        once a tensor of it was replaced, added or removed (the padded tensor no longer holds what the list says)."""
        if len(self) != len(self._rows) or any(row is not made for row, made in zip(self, self._rows)):
            return None
        return self.padded

    def __reduce__(self):
        return list, (list(self),)


def non_max_suppression_reference(
    prediction: torch.Tensor,
    conf_thres: float = 0.25,
    iou_thres: float = 0.45,
    classes: Sequence[int] | None = None,
    agnostic: bool = False,
    multi_label: bool = False,
    max_det: int = 300,
    nc: int = 0,
    max_nms: int = 30000,
    max_wh: float = 7680,
) -> list[torch.Tensor]:
    """Readable pure-PyTorch statement of what the operator computes, image by image (slow; for tests).

    The candidate order is descending score, ties broken by ascending ``anchor * nc + class``; greedy suppression
    keeps a box unless a kept box of higher rank overlaps it with IoU > ``iou_thres`` (compared in float32).
    """
    num_classes = nc or prediction.shape[1] - 4
    multi_label = multi_label and num_classes > 1
    conf = torch.tensor(conf_thres, dtype=prediction.dtype).float().item()  # torch compares in the tensor's dtype
    output = []
    for image in prediction:
        boxes, scores, extras = image.split((4, num_classes, image.shape[0] - 4 - num_classes))
        half_size = boxes[2:] / 2  # xywh -> xyxy in the input dtype, as stock
        xyxy = torch.cat((boxes[:2] - half_size, boxes[:2] + half_size)).float().T
        scores = scores.float().T  # (A, nc)
        passing = scores.amax(1) > conf  # NaN anywhere makes amax NaN: the anchor never passes
        if multi_label:
            anchors, labels = torch.nonzero((scores > conf) & passing[:, None], as_tuple=True)
        else:
            anchors = torch.nonzero(passing).flatten()
            labels = scores[anchors].argmax(1)
        if classes is not None:
            keep = torch.isin(labels, torch.tensor(list(classes), dtype=labels.dtype))
            anchors, labels = anchors[keep], labels[keep]
        candidate_scores = scores[anchors, labels]
        order = torch.argsort(candidate_scores, descending=True, stable=True)[:max_nms]
        anchors, labels, candidate_scores = anchors[order], labels[order], candidate_scores[order]
        offset_boxes = xyxy[anchors] + labels[:, None].float() * (0.0 if agnostic else float(max_wh))
        areas = (offset_boxes[:, 2] - offset_boxes[:, 0]) * (offset_boxes[:, 3] - offset_boxes[:, 1])
        kept: list[int] = []
        for i in range(len(anchors)):
            if len(kept) == max_det:
                break
            if kept:
                earlier = offset_boxes[kept]
                size = (torch.minimum(earlier[:, 2:], offset_boxes[i, 2:]) - torch.maximum(earlier[:, :2],
                                                                                          offset_boxes[i, :2]))
                intersection = size.clamp(min=0).prod(1)
                iou = intersection / (areas[kept] + areas[i] - intersection)
                if (iou > torch.tensor(iou_thres, dtype=torch.float32)).any():
                    continue
            kept.append(i)
        kept_anchors = anchors[kept]
        output.append(torch.cat((xyxy[kept_anchors], candidate_scores[kept, None], labels[kept, None].float(),
                                 extras.float().T[kept_anchors]), 1))
    return output
