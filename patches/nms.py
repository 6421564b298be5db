"""Patch Ultralytics' ``non_max_suppression`` with the batched operator's drop-in.

Predictors (``DetectionPredictor.postprocess``, which Segment and Pose reuse), validators
(``DetectionValidator.postprocess``) and ``AutoBackend``'s warm-up all call it through the module attribute, so
swapping that attribute reaches every caller: in ``ultralytics.utils.nms`` (8.3.200 and later), in
``ultralytics.utils.ops`` up to 8.3.100. The drop-in hands rotated (OBB) and end-to-end predictions, and anything its
operator does not cover, to the stock function; on releases whose function also takes ``labels`` (hybrid
auto-labelling) or ``in_place``, a call that uses them runs stock.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from yolo_fastdetect.ops import nms as ops_nms

from ._patching import Declined, Patch, Replacement, require

# Arguments of the drop-in that the stock function must take (the others it may lack: they are left at their default).
_REQUIRED = ("prediction", "conf_thres", "iou_thres", "classes", "agnostic", "multi_label", "max_det", "nc",
             "max_nms", "max_wh")
# Arguments of older stock functions that the drop-in does not take, and the value under which it still applies.
_STOCK_ONLY = {"labels": (), "in_place": True}


def _drop_in_for(stock: Callable) -> Callable:
    """The drop-in with ``stock``'s signature: a call with a stock-only argument away from its usual value runs
    ``stock``; every other call runs :func:`yolo_fastdetect.ops.nms.non_max_suppression`."""
    signature = inspect.signature(stock)
    drop_in_parameters = inspect.signature(ops_nms.non_max_suppression).parameters
    extra = [name for name in signature.parameters if name not in drop_in_parameters]
    require(set(extra) <= set(_STOCK_ONLY), f"non_max_suppression takes arguments the drop-in does not: {extra}")
    if not extra:
        return ops_nms.non_max_suppression

    def non_max_suppression(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        labels, in_place = arguments.pop("labels", ()), arguments.pop("in_place", True)
        if (labels is not None and len(labels)) or not in_place:
            return stock(*args, **kwargs)
        return ops_nms.non_max_suppression(**arguments)

    non_max_suppression.__signature__ = signature
    non_max_suppression.__doc__ = ops_nms.non_max_suppression.__doc__
    return non_max_suppression


def _plan() -> list[Replacement]:
    """Replace ``non_max_suppression`` in the module its callers read it from, adapted to its signature."""
    for name in ("ultralytics.utils.nms", "ultralytics.utils.ops"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        stock = getattr(module, "non_max_suppression", None)
        if stock is None:
            continue
        require(stock is ops_nms.stock_non_max_suppression,
                f"{name}.non_max_suppression is not the function yolo_fastdetect.ops.nms falls back on")
        parameters = inspect.signature(stock).parameters
        missing = [argument for argument in _REQUIRED if argument not in parameters]
        require(not missing, f"{name}.non_max_suppression lacks the arguments {missing}")
        return [Replacement(module, "non_max_suppression", _drop_in_for(stock))]
    raise Declined("neither ultralytics.utils.nms nor ultralytics.utils.ops has non_max_suppression")


PATCH = Patch(
    "nms",
    "non_max_suppression(prediction, conf_thres, iou_thres, classes, agnostic, multi_label, max_det, nc, max_nms, "
    "max_wh, ...) in ultralytics.utils.nms (8.3.200 on) or ultralytics.utils.ops (to 8.3.100)",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied

