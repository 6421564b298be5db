"""Patch ``ultralytics.utils.nms.non_max_suppression`` with the batched operator's drop-in.

Predictors (``DetectionPredictor.postprocess``, which Segment and Pose reuse), validators
(``DetectionValidator.postprocess``) and ``AutoBackend``'s warm-up all call it through the module attribute, so
swapping that attribute reaches every caller. The drop-in hands rotated (OBB) and end-to-end predictions, and
anything its operator does not cover, to the stock function.
"""

from __future__ import annotations

from ultralytics.utils import nms as ultralytics_nms

from yolo_fastdetect.ops.nms import non_max_suppression

_ORIGINALS: dict[str, object] = {}


def apply() -> None:
    """Install the batched NMS (idempotent)."""
    if not is_applied():
        _ORIGINALS["non_max_suppression"] = ultralytics_nms.non_max_suppression
        ultralytics_nms.non_max_suppression = non_max_suppression


def revert() -> None:
    """Restore the original ``non_max_suppression`` (idempotent)."""
    if is_applied():
        ultralytics_nms.non_max_suppression = _ORIGINALS.pop("non_max_suppression")


def is_applied() -> bool:
    """Whether ``ultralytics.utils.nms.non_max_suppression`` is the batched drop-in."""
    return ultralytics_nms.non_max_suppression is non_max_suppression
