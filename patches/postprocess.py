"""Patch ``DetectionPredictor.postprocess``: on a GPU, a few images' NMS and box scaling replayed from a CUDA graph.

After the forward pass, stock post-processing of a batch is some thirty small launches: the batched NMS's selection,
sort and suppression kernels with its non-finite check, then stock's ``scale_boxes`` (twelve in-place operations),
each 10-20 us of host time while the GPU waits: at batch 1 the NMS drop-in's host time exceeded its GPU time. One
graph per key (the prediction's shape, the NMS arguments, the input and original image sizes) replays them with one
launch: the same kernels on a copy of the prediction, so the same detections bit for bit (see
benchmarks/RESULTS.md, End to end, for what the graph saves).

It applies to plain detection that ``DetectionPredictor`` builds (task ``detect``, not end-to-end, no object
features, no extra arguments, no ``construct_result(s)`` of a subclass's own) with the batched NMS installed, a
CUDA prediction that NMS covers, one original image size in the batch, at most :data:`MAX_GRAPHED_BATCH` images,
and ``YOLO_FASTDETECT_GRAPHS`` not 0. Anything else, and a batch with a non-finite box (which the NMS hands to the
stock function), runs the stock method. Graphs are kept as the forward pass's are
(:class:`yolo_fastdetect.graphs.GraphCache`: a key's second call captures it, at most ``YOLO_FASTDETECT_GRAPH_CACHE``
graphs); the detections are copied out of the graph's memory before they reach the ``Results``. It needs the nms and
results patches (their drop-in and stock's ``construct_result`` structure) and stays off where either is.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from ultralytics.engine.results import Results
from ultralytics.models.yolo.detect import DetectionPredictor

from yolo_fastdetect.graphs import GraphCache
from yolo_fastdetect.ops.nms import (
    batched_nms,
    counts_and_nonfinite_flag,
    image_rows,
    operator_arguments,
    stock_non_max_suppression,
)

from . import nms as nms_patch
from . import results as results_patch
from ._patching import Patch, Replacement, parameters, require
from .predictor import replay_on
from .results import builds_stock_results, detection_results, scale_by_size

# Post-processing costs the same launches per call whatever the batch, so a graph saves little per image beyond a
# few images, and each graph holds a copy of its prediction (90 MB at batch 64, 640x640, fp16).
MAX_GRAPHED_BATCH = 8
# What stock's DetectionPredictor.postprocess leaves at non_max_suppression's defaults.
_MULTI_LABEL, _MAX_NMS, _MAX_WH = False, 30000, 7680

_cache = GraphCache()
_UNOWNED = nn.Module()  # a graph reads only its own copy of the prediction: no model owns it


def graphed_prediction(predictor: DetectionPredictor, preds, orig_imgs, kwargs: dict) -> torch.Tensor | None:
    """The prediction tensor whose NMS and box scaling :func:`postprocess` replays from a graph, or None where the
    stock method runs (see the module docstring)."""
    if kwargs or not replay_on() or not nms_patch.is_applied():
        return None
    args = predictor.args
    if args.task != "detect" or getattr(predictor, "_feats", None) is not None:
        return None
    if getattr(predictor.model, "end2end", False) or not builds_stock_results(predictor):
        return None
    prediction = preds[0] if isinstance(preds, (list, tuple)) else preds
    if not (isinstance(prediction, torch.Tensor) and prediction.is_cuda and prediction.dim() == 3):
        return None
    if not isinstance(orig_imgs, list) or not 1 <= len(orig_imgs) <= MAX_GRAPHED_BATCH:
        return None
    if len(orig_imgs) != prediction.shape[0] or len({tuple(image.shape[:2]) for image in orig_imgs}) != 1:
        return None
    return prediction


def _nms_and_scale(prediction: torch.Tensor, arguments: tuple, input_shape: tuple, orig_shape: tuple):
    """The batched NMS's padded detections scaled to the original size in place, and its counts followed by the
    non-finite flag: what one graph replays."""
    detections, counts, _ = batched_nms(prediction, *arguments)
    scale_by_size(detections, input_shape, [orig_shape] * prediction.shape[0])
    return detections, counts_and_nonfinite_flag(counts, prediction)


def postprocess(self: DetectionPredictor, preds, img, orig_imgs, **kwargs) -> list[Results]:
    """``DetectionPredictor.postprocess`` with NMS and box scaling replayed from a CUDA graph where
    :func:`graphed_prediction` allows; the stock method otherwise."""
    prediction = graphed_prediction(self, preds, orig_imgs, kwargs)
    args = self.args
    arguments = None if prediction is None else operator_arguments(
        prediction, args.conf, args.iou, args.classes, args.agnostic_nms, _MULTI_LABEL, args.max_det, 0, _MAX_NMS,
        _MAX_WH)
    if arguments is None:
        return PATCH.original("postprocess")(self, preds, img, orig_imgs, **kwargs)
    input_shape, orig_shape = tuple(img.shape[2:]), tuple(orig_imgs[0].shape[:2])
    detections, counts = _cache(lambda x: _nms_and_scale(x, arguments, input_shape, orig_shape), prediction,
                                owner=_UNOWNED, variant=(arguments, input_shape, orig_shape))
    *counts, nonfinite = counts.tolist()  # the one copy to the host
    if nonfinite:
        return PATCH.original("postprocess")(self, preds, img, orig_imgs, **kwargs)
    # The next replay of this graph rewrites its outputs; the Results keep a copy.
    return detection_results(self, image_rows(detections.clone(), counts), orig_imgs)


def _plan() -> list[Replacement]:
    """``postprocess`` on ``DetectionPredictor``, where the nms and results patches apply and stock's NMS defaults
    are those the graph uses."""
    require(nms_patch.PATCH.available() and results_patch.PATCH.available(),
            "needs the nms and results patches, and one of them declines")
    stock = vars(DetectionPredictor).get("postprocess")
    require(stock is not None and parameters(stock)[:4] == ["self", "preds", "img", "orig_imgs"],
            "DetectionPredictor.postprocess is not (self, preds, img, orig_imgs, ...)")
    defaults = {name: p.default for name, p in inspect.signature(stock_non_max_suppression).parameters.items()}
    require((defaults.get("multi_label"), defaults.get("max_nms"), defaults.get("max_wh")) == (_MULTI_LABEL, _MAX_NMS,
            _MAX_WH), "stock non_max_suppression's multi_label/max_nms/max_wh defaults differ from the graph's")
    return [Replacement(DetectionPredictor, "postprocess", postprocess)]


PATCH = Patch(
    "postprocess",
    "DetectionPredictor.postprocess(preds, img, orig_imgs, **kwargs) with the nms and results patches on; stock NMS "
    "defaults multi_label=False, max_nms=30000, max_wh=7680",
    _plan,
    on_revert=lambda: _cache.clear(),
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied


def graph_count() -> int:
    """Number of post-processing graphs held (for tests and diagnostics)."""
    return len(_cache)
