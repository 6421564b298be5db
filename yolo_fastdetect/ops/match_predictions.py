"""Validation's matching of detections to labels: ``yolo_fastdetect::match_predictions`` (CPU).

Ultralytics' ``BaseValidator.match_predictions`` (the greedy form, from 8.4.1xx on) walks an image's detections in
descending confidence, and at each IoU threshold lets each one claim the unclaimed label it overlaps most (numpy's
``argmax``: the first maximum); the detection is correct there when that IoU reaches the threshold. Stock runs the
walk in numpy, one detection (about ten numpy calls) at a time; the operator runs the same walk in one call, with the
same float32 comparisons, so its answer is stock's bit for bit (``tests/test_val_metrics.py``).
:func:`match_predictions_reference` is the walk written out in numpy, threshold by threshold.
"""

from __future__ import annotations

import numpy as np
import torch

from .._ext import on_load, require

__all__ = ["match_predictions", "match_predictions_reference"]


def match_predictions(iou: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Which detections are correct at each IoU threshold, matched greedily in confidence order.

    Args:
        iou (torch.Tensor): (M, N) float32 on the CPU: IoU of each label (rows) with each detection (columns, in
            descending confidence), zero where their classes differ.
        thresholds (torch.Tensor): (T,) float32 on the CPU: the IoU thresholds (Ultralytics' ``iouv``).

    Returns:
        (torch.Tensor): (N, T) bool: detection j is correct at threshold t.

    Examples:
        >>> iou = torch.tensor([[0.9, 0.8], [0.0, 0.6]])
        >>> match_predictions(iou, torch.tensor([0.5, 0.7])).tolist()
        [[True, True], [True, False]]
    """
    require()
    for name, tensor in (("iou", iou), ("thresholds", thresholds)):
        if tensor.device.type != "cpu":
            raise ValueError(f"match_predictions: {name} must be on the CPU, got {tensor.device}")
    return torch.ops.yolo_fastdetect.match_predictions(iou, thresholds)


def match_predictions_reference(iou: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """:func:`match_predictions` in numpy, one threshold at a time (the thresholds do not interact): ``iou`` (M, N)
    and ``thresholds`` (T,) as float32 arrays; returns (N, T) bool.

    Examples:
        >>> match_predictions_reference(np.array([[0.9, 0.8], [0.0, 0.6]]), np.array([0.5, 0.7])).tolist()
        [[True, True], [True, False]]
    """
    iou, thresholds = np.asarray(iou, np.float32), np.asarray(thresholds, np.float32)
    correct = np.zeros((iou.shape[1], len(thresholds)), dtype=bool)
    if not iou.size or not thresholds.size:
        return correct
    # Only detections overlapping some label by the lowest threshold take part (none where a threshold is NaN).
    candidates = np.flatnonzero((iou >= thresholds.min()).any(0))
    for t, threshold in enumerate(thresholds):
        claimed = np.zeros(iou.shape[0], dtype=bool)
        for j in candidates:
            available = np.where(claimed, np.float32(0), iou[:, j])
            best = int(np.argmax(available))
            correct[j, t] = available[best] >= threshold
            claimed[best] |= correct[j, t]
    return correct


def _match_predictions_fake(iou, thresholds):
    return iou.new_empty((iou.shape[1], thresholds.shape[0]), dtype=torch.bool)


@on_load
def _register() -> None:
    torch.library.register_fake("yolo_fastdetect::match_predictions")(_match_predictions_fake)
