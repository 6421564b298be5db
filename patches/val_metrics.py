"""Patch ``DetectionValidator.update_metrics``: each batch's detections and labels read from host copies.

Stock's ``update_metrics`` works image by image on the device's tensors: selecting the image's labels, scaling them,
their IoU with the detections, the class mask, and five copies to the host, each of them a few small kernel launches
and a synchronisation, on the main thread between two forward passes (1.4 ms an image on the H100 host at conf 0.001,
more than the forward and the NMS together: docs/design.md, Validation). The patched method copies the batch's
detections (one transfer) and its labels to the host first and runs stock's ``update_metrics`` on the copies, with the
validator's ``device`` the CPU for that call: the same code, the same float32 arithmetic (element-wise operations,
which round alike on both devices), no synchronisation per image.

That call runs on a worker thread of the validator's own, batch after batch in the loop's order, while the main
thread goes on to the next batch: the per-image Python of stock's method (7-14 ms a batch of 32 at conf 0.001)
overlaps the next forward pass, whose GPU time the main thread otherwise spends waiting. The worker sees the
validator as :class:`_OnTheHost` shows it (its state, with the CPU for its device), so the main thread's ``device``
never changes under it. ``gather_stats`` and ``get_stats``, the first to read the metrics after the loop, wait for
every batch handed over and raise the first error a batch's update raised. A batch is updated at once, as stock
does, where a callback other than stock's empty one runs at ``on_val_batch_end`` (it may read the metrics) or with
``visualize`` (its plots read the batch's image on the GPU).

It applies to plain detection (the validator's ``update_metrics``, ``_prepare_batch``, ``_prepare_pred`` and
``_process_batch`` are ``DetectionValidator``'s own) on a CUDA device. Releases whose ``_prepare_batch`` or
``_prepare_pred`` rescale boxes (``scale_boxes``, up to 8.3.1xx: a division by a number, which CUDA computes as a
multiplication by its reciprocal and the CPU does not) keep stock's method.
"""

from __future__ import annotations

import inspect
import math
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from ultralytics.models.yolo.detect import DetectionValidator
from ultralytics.utils.callbacks import base as stock_callbacks

from ._patching import Patch, Replacement, parameters, require

# The methods update_metrics calls, which a subclass (segmentation, pose) overrides to read its own device tensors.
_HELPERS = ("_prepare_batch", "_prepare_pred", "_process_batch")
# The methods that read the metrics after the loop (gather_stats from 8.3.1xx on), which wait for the worker's updates.
_READERS = ("gather_stats", "get_stats")


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


class _OnTheHost:
    """A validator as stock's ``update_metrics`` sees it on the worker: its attributes and methods (bound to this view,
    so the helpers see it too) and every assignment made on it are the validator's, but its ``device`` is the CPU."""

    __slots__ = ("_validator",)
    device = torch.device("cpu")

    def __init__(self, validator: DetectionValidator):
        object.__setattr__(self, "_validator", validator)

    def __getattr__(self, name: str) -> Any:
        validator = self._validator
        method = inspect.getattr_static(type(validator), name, None)
        if inspect.isfunction(method) and name not in vars(validator):  # a plain method (not static, not a class's)
            return method.__get__(self)
        return getattr(validator, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._validator, name, value)


class _MetricsWorker:
    """One thread updating a validator's metrics batch after batch, in the order they were handed over."""

    def __init__(self):
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="yolo_fastdetect-val-metrics")
        self._pending: list[Future] = []

    def submit(self, update, *args) -> None:
        """Run ``update(*args)`` after the updates handed over before it."""
        self._pending.append(self._thread.submit(update, *args))

    def finish(self) -> None:
        """Wait for every update handed over, end the thread, and raise the first error one of them raised."""
        pending, self._pending = self._pending, []
        self._thread.shutdown(wait=True)
        for update in pending:
            update.result()


# Each validator's _MetricsWorker, from its loop's first batch handed over to the end of the loop.
_WORKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _may_defer(validator: DetectionValidator) -> bool:
    """Whether the validator's metrics may lag its loop by a batch: nothing reads them before ``gather_stats`` and
    ``get_stats`` (the patched ones) but the callbacks at the end of each batch, stock's empty one alone here, and no
    plot of ``visualize`` reads the batch's image."""
    cls = type(validator)
    return (not getattr(validator.args, "visualize", False)
            and all(getattr(cls, name, None) is getattr(DetectionValidator, name, None) for name in _READERS)
            and all(callback is stock_callbacks.on_val_batch_end
                    for callback in getattr(validator, "callbacks", {}).get("on_val_batch_end", [])))


def update_metrics(self: DetectionValidator, preds: Any, batch: dict[str, Any]) -> None:
    """Stock's ``update_metrics`` on host copies of the batch's detections and labels where
    :func:`host_copies_apply`, on the validator's worker thread where :func:`_may_defer`."""
    original = PATCH.original("update_metrics")
    if not host_copies_apply(self, preds):
        return original(self, preds, batch)
    labels = {key: value.cpu() if isinstance(value, torch.Tensor) and key != "img" else value
              for key, value in batch.items()}
    if not _may_defer(self):
        return original(_OnTheHost(self), host_predictions(preds), labels)
    worker = _WORKERS.get(self)
    if worker is None:
        worker = _WORKERS[self] = _MetricsWorker()
    worker.submit(original, _OnTheHost(self), host_predictions(preds), labels)
    return None


def _finish_updates(validator: DetectionValidator) -> None:
    """Wait for the validator's metrics updates handed to its worker (none where it has none)."""
    worker = _WORKERS.pop(validator, None)
    if worker is not None:
        worker.finish()


def gather_stats(self: DetectionValidator) -> Any:
    """Stock's ``gather_stats`` once the batches' metrics updates are done."""
    _finish_updates(self)
    return PATCH.original("gather_stats")(self)


def get_stats(self: DetectionValidator) -> Any:
    """Stock's ``get_stats`` once the batches' metrics updates are done."""
    _finish_updates(self)
    return PATCH.original("get_stats")(self)


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
    readers = {"gather_stats": gather_stats, "get_stats": get_stats}
    present = [name for name in _READERS if getattr(DetectionValidator, name, None) is not None]
    require("get_stats" in present, "DetectionValidator has no get_stats")
    for name in present:
        require(parameters(getattr(DetectionValidator, name)) == ["self"], f"DetectionValidator.{name} is not (self)")
    require(callable(getattr(stock_callbacks, "on_val_batch_end", None)),
            "ultralytics.utils.callbacks.base has no on_val_batch_end")
    return [Replacement(DetectionValidator, "update_metrics", update_metrics),
            *(Replacement(DetectionValidator, name, readers[name]) for name in present)]


PATCH = Patch(
    "val_metrics",
    "DetectionValidator.update_metrics(preds, batch) with _prepare_batch, _prepare_pred and _process_batch that do "
    "not rescale boxes",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
