"""Patch ``BaseValidator.match_predictions``: the greedy matching of detections to labels in one operator call.

Validation decides, for each detection of each image and each of the ten IoU thresholds, whether it is a true
positive: stock's ``match_predictions`` (the greedy form, Ultralytics 8.4.1xx on) walks the detections in confidence
order in numpy, about ten numpy calls per detection that overlaps a label, on the main thread (with up to 300
detections an image at conf 0.001, the largest part of ``update_metrics``). The patched method masks the IoU by class
as stock does and hands the walk to :func:`yolo_fastdetect.ops.match_predictions`, which returns stock's answer bit
for bit.

The plan checks behaviour, not only the signature: stock's method must give :func:`~yolo_fastdetect.ops.
match_predictions.match_predictions_reference`'s answer on seeded cases with ties, classes and empty rows; releases
whose matching differs (before 8.4.1xx: each threshold's matches sorted by IoU) keep stock's. Hungarian matching
(``use_scipy``), a non-float32 IoU and a library that cannot load run stock's method.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from ultralytics.engine.validator import BaseValidator

from yolo_fastdetect import _ext
from yolo_fastdetect.ops.match_predictions import match_predictions as match_greedily
from yolo_fastdetect.ops.match_predictions import match_predictions_reference

from ._patching import Patch, Replacement, parameters, require

# Validation's IoU thresholds (Ultralytics' iouv): the probe's and the usual ones.
IOU_THRESHOLDS = torch.linspace(0.5, 0.95, 10)


def match_predictions(self: BaseValidator, pred_classes: torch.Tensor, true_classes: torch.Tensor, iou: torch.Tensor,
                      use_scipy: bool = False) -> torch.Tensor:
    """Stock's ``match_predictions``, the greedy walk in :func:`yolo_fastdetect.ops.match_predictions`."""
    original = PATCH.original("match_predictions")
    if use_scipy or iou.dtype != torch.float32 or self.iouv.dtype != torch.float32 or not _ext.available():
        return original(self, pred_classes, true_classes, iou, use_scipy)
    return match_greedily(class_masked(pred_classes, true_classes, iou).cpu(), self.iouv.cpu())


def class_masked(pred_classes: torch.Tensor, true_classes: torch.Tensor, iou: torch.Tensor) -> torch.Tensor:
    """``iou`` with the pairs of different classes zeroed, as stock masks it before matching."""
    return iou * (true_classes[:, None] == pred_classes)


def probe_cases(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Seeded (pred_classes, true_classes, iou) cases on which greedy and other matchings disagree: IoU on a coarse
    grid (ties), two classes, labels overlapping several detections, an empty image."""
    generator = np.random.default_rng(seed)
    cases = []
    for labels, detections in ((3, 7), (6, 12), (1, 5), (4, 1), (0, 3)):
        iou = (generator.integers(0, 21, (labels, detections)) / 20).astype(np.float32)
        cases.append((torch.from_numpy(generator.integers(0, 2, detections).astype(np.float32)),
                      torch.from_numpy(generator.integers(0, 2, labels).astype(np.float32)), torch.from_numpy(iou)))
    return cases


def _plan() -> list[Replacement]:
    """``match_predictions(pred_classes, true_classes, iou, use_scipy)`` on ``BaseValidator``, matching greedily."""
    stock = getattr(BaseValidator, "match_predictions", None)
    require(callable(stock) and parameters(stock)[:4] == ["self", "pred_classes", "true_classes", "iou"],
            "BaseValidator.match_predictions is not (self, pred_classes, true_classes, iou, ...)")
    holder = SimpleNamespace(iouv=IOU_THRESHOLDS)
    for pred_classes, true_classes, iou in probe_cases():
        expected = match_predictions_reference(class_masked(pred_classes, true_classes, iou).numpy(),
                                               IOU_THRESHOLDS.numpy())
        require(np.array_equal(stock(holder, pred_classes, true_classes, iou).numpy(), expected),
                "BaseValidator.match_predictions does not match greedily in confidence order (before 8.4.1xx)")
    return [Replacement(BaseValidator, "match_predictions", match_predictions)]


PATCH = Patch(
    "val_matching",
    "BaseValidator.match_predictions(pred_classes, true_classes, iou, use_scipy) matching greedily by confidence",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
