"""Patch ``DetectionValidator.update_metrics``: each batch's detections and labels read from host copies.

Stock's ``update_metrics`` works image by image on the device's tensors: selecting the image's labels, scaling them,
their IoU with the detections, the class mask, and five copies to the host, each of them a few small kernel launches
and a synchronisation, on the main thread between two forward passes (1.4 ms an image on the H100 host at conf 0.001,
more than the forward and the NMS together: docs/design.md, Validation). The patched method copies the batch's
detections (one transfer) and its labels to the host first and runs stock's ``update_metrics`` on the copies, with the
validator's ``device`` the CPU for that call: the same code, the same float32 arithmetic (element-wise operations,
which round alike on both devices), no synchronisation per image.

It applies to plain detection (the validator's ``update_metrics``, ``_prepare_batch``, ``_prepare_pred`` and
``_process_batch`` are ``DetectionValidator``'s own) on a CUDA device. Releases whose ``_prepare_batch`` or
``_prepare_pred`` rescale boxes (``scale_boxes``, up to 8.3.1xx: a division by a number, which CUDA computes as a
multiplication by its reciprocal and the CPU does not) keep stock's method.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from ultralytics.models.yolo.detect import DetectionValidator

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


def host_predictions(preds: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """``preds`` (one dict of (N_i, ...) tensors per image) copied to the host in one transfer: every image's fields
    side by side in one float32 tensor, then split back into views of each field's shape and dtype."""
    if not preds or not preds[0]:
        return [dict(pred) for pred in preds]
    fields = list(preds[0])
    widths = [math.prod(preds[0][name].shape[1:]) for name in fields]
    rows = [torch.cat([_columns(pred[name]) for name in fields], 1) for pred in preds]
    copies = []
    for pred, image in zip(preds, torch.cat(rows).cpu().split([len(row) for row in rows])):
        copies.append({name: column.reshape(pred[name].shape).to(pred[name].dtype)
                       for name, column in zip(fields, image.split(widths, 1))})
    return copies


def update_metrics(self: DetectionValidator, preds: Any, batch: dict[str, Any]) -> None:
    """Stock's ``update_metrics`` on host copies of the batch's detections and labels where
    :func:`host_copies_apply`."""
    original = PATCH.original("update_metrics")
    if not host_copies_apply(self, preds):
        return original(self, preds, batch)
    labels = {key: value.cpu() if isinstance(value, torch.Tensor) and key != "img" else value
              for key, value in batch.items()}
    device, self.device = self.device, torch.device("cpu")
    try:
        return original(self, host_predictions(preds), labels)
    finally:
        self.device = device


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
    return [Replacement(DetectionValidator, "update_metrics", update_metrics)]


PATCH = Patch(
    "val_metrics",
    "DetectionValidator.update_metrics(preds, batch) with _prepare_batch, _prepare_pred and _process_batch that do "
    "not rescale boxes",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
