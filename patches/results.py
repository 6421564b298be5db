"""Patch ``DetectionPredictor.construct_results``: the boxes of the whole batch mapped back to the original images at
once, then the ``Results`` built as stock builds them.

Stock's ``construct_result`` calls ``ops.scale_boxes`` image by image, twelve tensor operations each; with the
batched NMS the predictions are the rows of one padded ``(B, max_det, 6)`` tensor, which
:func:`yolo_fastdetect.ops.scale_boxes_in_place` maps in three (bit-identical to stock: see that module). It applies
to plain detection: the predictions are those rows (the batched NMS ran, no extra ``construct_results``
arguments) and the predictor builds each result with ``DetectionPredictor.construct_result`` (Segment, Pose and OBB
predictors, and subclasses that build their own, run stock).
"""

from __future__ import annotations

import torch
from ultralytics.engine.results import Results
from ultralytics.models.yolo.detect import DetectionPredictor

from yolo_fastdetect.ops.letterbox import letterbox_geometry
from yolo_fastdetect.ops.scale_boxes import scale_boxes_in_place

_ORIGINALS: dict[str, object] = {}


def padded_batch(preds: list) -> torch.Tensor | None:
    """The float32 ``(B, max_det, 6)`` tensor whose image ``i`` the rows ``preds[i]`` begin, as the batched NMS
    returns them (views of one padded tensor that fill its whole storage), or None where ``preds`` are anything else.

    Found from the storage: under ``torch.inference_mode`` (the predictor's) views do not record their base.
    """
    if not isinstance(preds, list) or not preds or not all(isinstance(pred, torch.Tensor) for pred in preds):
        return None
    first, storage_bytes = preds[0], preds[0].untyped_storage().nbytes()
    image_bytes, remainder = divmod(storage_bytes, len(preds))
    max_det = image_bytes // (6 * 4)
    if remainder or image_bytes != max_det * 6 * 4 or first.dtype != torch.float32 or first.storage_offset() != 0:
        return None
    for image, pred in enumerate(preds):
        if not (pred.dtype == torch.float32 and pred.dim() == 2 and pred.shape[1] == 6 and pred.shape[0] <= max_det
                and pred.stride() == (6, 1) and pred.storage_offset() == image * max_det * 6
                and pred.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()):
            return None
    return first.as_strided((len(preds), max_det, 6), (max_det * 6, 6, 1), 0)


def construct_results(self: DetectionPredictor, preds, img, orig_imgs, *args, **kwargs) -> list[Results]:
    """``DetectionPredictor.construct_results`` with the batch's boxes scaled in one go where :func:`padded_batch`
    finds the batched NMS's rows and ``construct_result`` is DetectionPredictor's; the stock method otherwise."""
    own_results = type(self).construct_result is not _ORIGINALS["construct_result"]
    batch = None if args or kwargs or own_results else padded_batch(preds)
    if batch is None:
        return _ORIGINALS["construct_results"](self, preds, img, orig_imgs, *args, **kwargs)
    input_shape = tuple(img.shape[2:])
    scale_boxes_in_place(batch, [letterbox_geometry(orig_img.shape, input_shape) for orig_img in orig_imgs])
    names = self.model.names
    return [Results(orig_img, path=img_path, names=names, boxes=pred[:, :6])
            for pred, orig_img, img_path in zip(preds, orig_imgs, self.batch[0])]


def apply() -> None:
    """Install the batched ``construct_results`` on ``DetectionPredictor`` (idempotent)."""
    if not is_applied():
        _ORIGINALS["construct_results"] = DetectionPredictor.__dict__["construct_results"]
        _ORIGINALS["construct_result"] = DetectionPredictor.__dict__["construct_result"]
        DetectionPredictor.construct_results = construct_results


def revert() -> None:
    """Restore stock's ``construct_results`` (idempotent)."""
    if is_applied():
        DetectionPredictor.construct_results = _ORIGINALS.pop("construct_results")
        _ORIGINALS.pop("construct_result")


def is_applied() -> bool:
    """Whether ``DetectionPredictor.construct_results`` is the batched one."""
    return DetectionPredictor.__dict__.get("construct_results") is construct_results
