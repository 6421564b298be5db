"""Patch ``DetectionValidator.update_metrics``: each batch's detections and labels read from host copies.

Stock's ``update_metrics`` works image by image on the device's tensors: selecting the image's labels, scaling them,
their IoU with the detections, the class mask, and five copies to the host, each of them a few small kernel launches
and a synchronisation, on the main thread between two forward passes (1.4 ms an image on the H100 host at conf 0.001,
more than the forward and the NMS together: docs/design.md, Validation). The patched method copies the batch's
detections (one transfer) and its labels to the host first and runs stock's ``update_metrics`` on the copies, with the
validator's ``device`` the CPU for that call: the same code, the same float32 arithmetic (element-wise operations,
which round alike on both devices), no synchronisation per image.

Within that call, stock's per-image helpers are answered from the whole batch (:class:`BatchAnswers`): each
image's labels and the IoU of every image's labels with its detections come from a few batch-wide operations, each
element computed as stock computes it; the matching stays the validator's ``match_predictions``, image by image. The
plan checks the answers against stock's helpers on a seeded batch, bit for bit, and where they differ (another
release's helpers) the call runs stock's helpers on the copies.

It applies to plain detection (the validator's ``update_metrics``, ``_prepare_batch``, ``_prepare_pred`` and
``_process_batch`` are ``DetectionValidator``'s own) on a CUDA device. Releases whose ``_prepare_batch`` or
``_prepare_pred`` rescale boxes (``scale_boxes``, up to 8.3.1xx: a division by a number, which CUDA computes as a
multiplication by its reciprocal and the CPU does not) keep stock's method.
"""

from __future__ import annotations

import inspect
import math
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from ultralytics.engine.validator import BaseValidator
from ultralytics.models.yolo.detect import DetectionValidator
from ultralytics.utils import ops

from ._patching import Patch, Replacement, parameters, require

# The methods update_metrics calls, which a subclass (segmentation, pose) overrides to read its own device tensors.
_HELPERS = ("_prepare_batch", "_prepare_pred", "_process_batch")


# Detection fields are float tensors; float32 holds float16 and bfloat16 exactly, so they travel in one float32 tensor.
_FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def host_copies_apply(validator: DetectionValidator, preds: Any) -> bool:
    """Whether ``update_metrics`` can run on host copies: a plain detection validator on a CUDA device, with stock's
    predictions (a list of dicts of float tensors, the same fields for every image), writing no boxes out.

    ``single_cls`` zeroes the classes of the predictions in place, which the plots read afterwards; ``save_json`` and
    ``save_txt`` rescale boxes (``scale_boxes``' division, see the module's docstring): those runs keep stock's."""
    cls, args = type(validator), validator.args
    return (getattr(validator.device, "type", None) == "cuda"
            and not (getattr(args, "single_cls", False) or getattr(args, "save_json", False)
                     or getattr(args, "save_txt", False))
            and all(getattr(cls, name) is getattr(DetectionValidator, name) for name in _HELPERS)
            and isinstance(preds, list) and all(isinstance(pred, dict) for pred in preds)
            and all(list(pred) == list(preds[0]) for pred in preds)
            and all(isinstance(value, torch.Tensor) and value.dtype in _FLOAT_TYPES and value.dim() >= 1
                    for pred in preds for value in pred.values()))


def _columns(value: torch.Tensor) -> torch.Tensor:
    """``value`` (N, ...) as (N, C) float32, C the product of the trailing sizes (1 for a vector)."""
    return value.reshape(value.shape[0], math.prod(value.shape[1:])).float()


# The most bytes host_predictions copies whole where every field views one storage: the NMS operator's padded
# (batch, max_det, 6) output is a few hundred kB; a field viewing some larger buffer takes the per-image path.
MAX_SHARED_STORAGE_BYTES = 64 << 20


def shared_storage(preds: list[dict[str, torch.Tensor]]) -> torch.Tensor | None:
    """The storage every field of every image views, as a flat tensor of their dtype, where they view one of at most
    :data:`MAX_SHARED_STORAGE_BYTES` (the NMS operator's rows: views of its padded output), else None."""
    values = [value for pred in preds for value in pred.values()]
    storage = values[0].untyped_storage()
    if storage.nbytes() > MAX_SHARED_STORAGE_BYTES or any(
            value.dtype != values[0].dtype or value.untyped_storage().data_ptr() != storage.data_ptr()
            for value in values):
        return None
    return values[0].new_empty(0).set_(storage)


def host_predictions(preds: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """``preds`` (one dict of (N_i, ...) tensors per image) copied to the host in one transfer: the storage they all
    view (:func:`shared_storage`) with each field rebuilt as the same view of the copy; otherwise every image's fields
    side by side in one float32 tensor, then split back into views of each field's shape and dtype."""
    if not preds or not preds[0]:
        return [dict(pred) for pred in preds]
    storage = shared_storage(preds)
    if storage is not None:
        copy = storage.cpu()
        return [{name: copy.as_strided(value.shape, value.stride(), value.storage_offset())
                 for name, value in pred.items()} for pred in preds]
    fields = list(preds[0])
    widths = [math.prod(preds[0][name].shape[1:]) for name in fields]
    rows = [torch.cat([_columns(pred[name]) for name in fields], 1) for pred in preds]
    copies = []
    for pred, image in zip(preds, torch.cat(rows).cpu().split([len(row) for row in rows])):
        copies.append({name: column.reshape(pred[name].shape).to(pred[name].dtype)
                       for name, column in zip(fields, image.split(widths, 1))})
    return copies


def label_counts(batch_idx: torch.Tensor, images: int) -> list[int] | None:
    """Labels per image where the batch's labels are grouped by image in order (``collate_fn``'s layout), else None.

    Examples:
        >>> label_counts(torch.tensor([0.0, 0.0, 2.0]), 3)
        [2, 0, 1]
        >>> label_counts(torch.tensor([1.0, 0.0]), 2) is None
        True
    """
    index = batch_idx.long()
    if (batch_idx.dim() != 1 or not torch.equal(index.to(batch_idx.dtype), batch_idx)
            or (len(index) and (int(index[0]) < 0 or int(index[-1]) >= images or bool((index.diff() < 0).any())))):
        return None
    return torch.bincount(index, minlength=images).tolist()


def pairwise_iou(labels: torch.Tensor, boxes: torch.Tensor, eps: float) -> torch.Tensor:
    """The IoU of each image's labels (B, L, 4) with its boxes (B, P, 4), both xyxy float32: (B, L, P), each element
    computed as stock's ``box_iou`` computes it for one image (the plan compares them, bit for bit)."""
    (a1, a2), (b1, b2) = labels.unsqueeze(2).chunk(2, 3), boxes.unsqueeze(1).chunk(2, 3)
    inter = (torch.min(a2, b2) - torch.max(a1, b1)).clamp_(0).prod(3)
    return inter / ((a2 - a1).prod(3) + (b2 - b1).prod(3) - inter + eps)


class BatchAnswers:
    """What stock's ``_prepare_batch(si, batch)`` and ``_process_batch(predn, pbatch)`` return for each image of a
    batch, computed for the whole batch: the labels scaled to the batch's image size in one operation and split by
    image, every image's IoU in one padded (B, L, P) pass, then the validator's ``match_predictions`` per image.

    Args:
        validator: The validator (its ``niou``, ``match_predictions`` and ``device``).
        preds: Each image's detections (``bboxes``, ``cls``), on the validator's device.
        batch: The batch's labels on that device (``batch_idx``, ``cls``, ``bboxes`` normalised xywh, ...).
        counts: Labels per image (:func:`label_counts`).
        eps: ``box_iou``'s epsilon.
    """

    def __init__(self, validator: Any, preds: list[dict[str, torch.Tensor]], batch: dict[str, Any],
                 counts: list[int], eps: float) -> None:
        imgsz = batch["img"].shape[2:]
        classes, boxes = batch["cls"].squeeze(-1), batch["bboxes"]
        if len(classes):
            boxes = ops.xywh2xyxy(boxes) * torch.tensor(imgsz, device=validator.device)[[1, 0, 1, 0]]
        self.prepared = [
            {"cls": image_classes, "bboxes": image_boxes, "ori_shape": batch["ori_shape"][si], "imgsz": imgsz,
             "ratio_pad": batch["ratio_pad"][si], "im_file": batch["im_file"][si]}
            for si, (image_classes, image_boxes) in enumerate(zip(classes.split(counts), boxes.split(counts)))]
        iou = pairwise_iou(pad_sequence([image["bboxes"].float() for image in self.prepared], batch_first=True),
                           pad_sequence([pred["bboxes"].float() for pred in preds], batch_first=True), eps)
        self.iou = iou
        self._validator, self._preds, self._true_positives = validator, preds, []
        for si, (pred, image) in enumerate(zip(preds, self.prepared)):
            labels, detections = len(image["cls"]), len(pred["cls"])
            if labels == 0 or detections == 0:
                self._true_positives.append(np.zeros((detections, validator.niou), dtype=bool))
            else:
                matched = validator.match_predictions(pred["cls"], image["cls"], iou[si, :labels, :detections])
                self._true_positives.append(matched.cpu().numpy())

    def prepare_batch(self, si: int, batch: dict[str, Any]) -> dict[str, Any]:
        """Stock's ``_prepare_batch(si, batch)`` for this batch."""
        return self.prepared[si]

    def process_batch(self, preds: dict[str, torch.Tensor], batch: dict[str, Any]) -> dict[str, np.ndarray]:
        """Stock's ``_process_batch(preds, batch)`` for an image of this batch; stock's method for other arguments."""
        for si, image in enumerate(self.prepared):
            if image is batch and self._preds[si] is preds:
                return {"tp": self._true_positives[si]}
        return type(self._validator)._process_batch(self._validator, preds, batch)


# box_iou's epsilon where the plan found BatchAnswers equal to stock's helpers, else None (stock's helpers run).
_answers_eps: float | None = None


def update_metrics(self: DetectionValidator, preds: Any, batch: dict[str, Any]) -> None:
    """Stock's ``update_metrics`` on host copies of the batch's detections and labels where
    :func:`host_copies_apply`, its per-image helpers answered by :class:`BatchAnswers`."""
    original = PATCH.original("update_metrics")
    if not host_copies_apply(self, preds):
        return original(self, preds, batch)
    labels = {key: value.cpu() if isinstance(value, torch.Tensor) and key != "img" else value
              for key, value in batch.items()}
    preds = host_predictions(preds)
    device, self.device = self.device, torch.device("cpu")
    counts = label_counts(labels["batch_idx"], len(preds)) if _answers_eps is not None and preds else None
    if counts is not None:
        answers = BatchAnswers(self, preds, labels, counts, _answers_eps)
        self._prepare_batch, self._process_batch = answers.prepare_batch, answers.process_batch
    try:
        return original(self, preds, labels)
    finally:
        self.device = device
        vars(self).pop("_prepare_batch", None)
        vars(self).pop("_process_batch", None)


def probe_batch(seed: int = 0) -> tuple[list[dict[str, torch.Tensor]], dict[str, Any]]:
    """A seeded batch of four 96x160 images (one without labels, one without detections) and detections over their
    labels, as the validator holds them on the host."""
    generator = torch.Generator().manual_seed(seed)
    label_count, detection_count = [3, 0, 5, 2], [6, 4, 0, 9]
    centres = torch.rand(sum(label_count), 2, generator=generator) * 0.6 + 0.2
    sizes = torch.rand(sum(label_count), 2, generator=generator) * 0.4 + 0.05
    classes = torch.randint(0, 2, (sum(label_count), 1), generator=generator).float()
    batch = {"img": torch.empty(4, 3, 96, 160), "cls": classes,
             "batch_idx": torch.cat([torch.full((n,), float(i)) for i, n in enumerate(label_count)]),
             "bboxes": torch.cat([centres, sizes], 1), "ori_shape": [(96, 160)] * 4,
             "ratio_pad": [((1.0, 1.0), (0.0, 0.0))] * 4, "im_file": [f"{i}.jpg" for i in range(4)]}
    preds = []
    for count in detection_count:
        corners = torch.rand(count, 2, generator=generator) * torch.tensor([120.0, 70.0])
        extent = torch.rand(count, 2, generator=generator) * 50 + 2
        preds.append({"bboxes": torch.cat([corners, corners + extent], 1),
                      "conf": torch.rand(count, generator=generator).sort(descending=True).values,
                      "cls": torch.randint(0, 2, (count,), generator=generator).float()})
    return preds, batch


def answers_match_stock(eps: float) -> bool:
    """Whether :class:`BatchAnswers` gives stock's ``_prepare_batch`` and ``_process_batch`` answers, and stock's
    ``box_iou``, on :func:`probe_batch`, bit for bit."""
    holder = SimpleNamespace(device=torch.device("cpu"), niou=10, iouv=torch.linspace(0.5, 0.95, 10))
    holder.match_predictions = BaseValidator.match_predictions.__get__(holder)
    box_iou = sys.modules[DetectionValidator.__module__].box_iou
    preds, batch = probe_batch()
    counts = label_counts(batch["batch_idx"], len(preds))
    answers = BatchAnswers(holder, preds, batch, counts, eps)
    for si, pred in enumerate(preds):
        stock = DetectionValidator._prepare_batch(holder, si, batch)
        ours = answers.prepare_batch(si, batch)
        if list(ours) != list(stock) or any(
                not torch.equal(ours[key], value) or ours[key].dtype != value.dtype if isinstance(value, torch.Tensor)
                else ours[key] != value for key, value in stock.items()):
            return False
        if not np.array_equal(answers.process_batch(pred, ours)["tp"],
                              DetectionValidator._process_batch(holder, pred, stock)["tp"]):
            return False
        labels, detections = len(stock["cls"]), len(pred["cls"])
        if labels and detections and not torch.equal(answers.iou[si, :labels, :detections],
                                                      box_iou(stock["bboxes"], pred["bboxes"])):
            return False
    return True


def _plan() -> list[Replacement]:
    """``update_metrics(preds, batch)`` on ``DetectionValidator``, whose helpers keep the boxes where the model put
    them."""
    stock = getattr(DetectionValidator, "update_metrics", None)
    require(callable(stock) and parameters(stock) == ["self", "preds", "batch"],
            "DetectionValidator.update_metrics is not (self, preds, batch)")
    for name in _HELPERS:
        helper = getattr(DetectionValidator, name, None)
        require(callable(helper), f"DetectionValidator has no {name}")
        require("scale_boxes" not in inspect.getsource(helper),
                f"DetectionValidator.{name} rescales boxes on the device (scale_boxes), as before 8.3.2xx")
    global _answers_eps
    eps = inspect.signature(sys.modules[DetectionValidator.__module__].box_iou).parameters.get("eps")
    _answers_eps = eps.default if eps is not None and answers_match_stock(eps.default) else None
    return [Replacement(DetectionValidator, "update_metrics", update_metrics)]


PATCH = Patch(
    "val_metrics",
    "DetectionValidator.update_metrics(preds, batch) with _prepare_batch, _prepare_pred and _process_batch that do "
    "not rescale boxes",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
