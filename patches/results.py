"""Patch ``DetectionPredictor.construct_results``: the boxes of the batch mapped back to the original images once per
distinct image size, then the ``Results`` built as stock builds them.

Stock's ``construct_result`` calls ``ops.scale_boxes`` image by image: twelve tensor operations each (four
subtractions of the padding, four divisions by the gain, four clamps), each a kernel launch on a GPU. With the
batched NMS the predictions are the rows of one padded ``(B, max_det, 6)`` tensor, so stock's own ``scale_boxes``
can run once on all the images of one size: on the whole batch in place where every image has the same size (a
folder of one camera, a video), else on each size's images gathered and written back. The same operations on more
elements: bit-identical to stock by construction, on every device.

It applies to plain detection: the predictions are those rows (the batched NMS's ``BatchDetections``, which carries
the padded tensor, reaches it unchanged; no extra ``construct_results`` arguments) and the predictor builds each
result with ``DetectionPredictor.construct_result`` (Segment, Pose and OBB predictors, and subclasses that build
their own, run stock). Releases without ``construct_results`` (8.3.0, which
builds the results inside ``postprocess``) leave the patch off.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from ultralytics.engine.results import Results
from ultralytics.models.yolo.detect import DetectionPredictor
from ultralytics.utils import ops

from yolo_fastdetect.ops.nms import BatchDetections

from ._patching import Patch, Replacement, parameters, require


def padded_batch(preds: list) -> torch.Tensor | None:
    """The float32 ``(B, max_det, 6)`` tensor whose image ``i`` the rows ``preds[i]`` begin, where ``preds`` is the
    batched NMS's :class:`~yolo_fastdetect.ops.nms.BatchDetections` as it made it; None for anything else (another
    list, rows with extra columns such as Segment's mask coefficients)."""
    padded = preds.padded_rows() if isinstance(preds, BatchDetections) else None
    return padded if padded is not None and padded.shape[2] == 6 else None


def scale_by_size(batch: torch.Tensor, input_shape: tuple[int, int], original_shapes: list[tuple]) -> None:
    """Stock ``ops.scale_boxes`` on the boxes of ``batch`` (``(B, N, 6)``, in place), once per distinct original
    size: on the whole batch where there is one, else on each size's images (gathered, scaled, written back)."""
    images_of_size: dict[tuple, list[int]] = {}
    for image, shape in enumerate(original_shapes):
        images_of_size.setdefault(tuple(shape[:2]), []).append(image)
    if len(images_of_size) == 1:
        ops.scale_boxes(input_shape, batch[..., :4], original_shapes[0])
        return
    for size, images in images_of_size.items():
        index = torch.tensor(images, device=batch.device)
        boxes = batch[index, :, :4]
        ops.scale_boxes(input_shape, boxes, size)
        batch[index, :, :4] = boxes


def construct_results(self: DetectionPredictor, preds, img, orig_imgs, *args, **kwargs) -> list[Results]:
    """``DetectionPredictor.construct_results`` with the boxes scaled by :func:`scale_by_size` where
    :func:`padded_batch` finds the batched NMS's rows and ``construct_result`` is DetectionPredictor's; the stock
    method otherwise."""
    own_results = type(self).construct_result is not DetectionPredictor.construct_result
    batch = None if args or kwargs or own_results else padded_batch(preds)
    if batch is None or len(orig_imgs) != len(preds):
        return PATCH.original("construct_results")(self, preds, img, orig_imgs, *args, **kwargs)
    scale_by_size(batch, tuple(img.shape[2:]), [orig_img.shape for orig_img in orig_imgs])
    return detection_results(self, preds, orig_imgs)


def detection_results(predictor: DetectionPredictor, preds: list[torch.Tensor], orig_imgs: list) -> list[Results]:
    """The ``Results`` that ``DetectionPredictor.construct_result`` builds from each image's rows once they are
    scaled to its original image."""
    names = predictor.model.names
    return [Results(orig_img, path=img_path, names=names, boxes=pred[:, :6])
            for pred, orig_img, img_path in zip(preds, orig_imgs, predictor.batch[0])]


def builds_stock_results(predictor: DetectionPredictor) -> bool:
    """Whether the predictor builds its results as ``DetectionPredictor`` does (not Segment, Pose and OBB
    predictors, nor subclasses with a ``construct_result(s)`` of their own)."""
    cls = type(predictor)
    return (PATCH.is_applied() and cls.construct_result is DetectionPredictor.construct_result
            and cls.construct_results in (construct_results, PATCH.original("construct_results")))


def _probe_matches_stock(stock) -> None:
    """Stock ``construct_results`` and :func:`scale_by_size` + :func:`detection_results` on the same seeded boxes
    (one letterboxed 32x48 input, two original sizes) must give the same boxes."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.rand(2, 3, 6, generator=generator) * torch.tensor([48.0, 32.0, 48.0, 32.0, 1.0, 1.0])
    images = [np.zeros((64, 96, 3), np.uint8), np.zeros((50, 40, 3), np.uint8)]
    predictor = SimpleNamespace(model=SimpleNamespace(names={0: "a"}), batch=[["a.jpg", "b.jpg"]])
    predictor.construct_result = DetectionPredictor.construct_result.__get__(predictor)
    img = torch.zeros(2, 3, 32, 48)
    expected = stock(predictor, list(rows.clone()), img, images)
    ours = rows.clone()
    scale_by_size(ours, (32, 48), [image.shape for image in images])
    got = detection_results(predictor, list(ours), images)
    require(all(torch.equal(a.boxes.data, b.boxes.data) for a, b in zip(expected, got)) and len(expected) == 2,
            "stock construct_results builds other boxes than scale_boxes once per size")


def _plan() -> list[Replacement]:
    """``construct_results`` on ``DetectionPredictor``, after checking both methods' signatures and a probe."""
    stock = vars(DetectionPredictor).get("construct_results")
    require(stock is not None and "construct_result" in vars(DetectionPredictor),
            "DetectionPredictor has no construct_results/construct_result (it builds Results in postprocess)")
    require(parameters(stock) == ["self", "preds", "img", "orig_imgs"],
            "DetectionPredictor.construct_results is not (self, preds, img, orig_imgs)")
    require(parameters(DetectionPredictor.construct_result) == ["self", "pred", "img", "orig_img", "img_path"],
            "DetectionPredictor.construct_result is not (self, pred, img, orig_img, img_path)")
    _probe_matches_stock(stock)
    return [Replacement(DetectionPredictor, "construct_results", construct_results)]


PATCH = Patch(
    "results",
    "DetectionPredictor.construct_results(preds, img, orig_imgs) calling construct_result(pred, img, orig_img, "
    "img_path), which scales with ops.scale_boxes and builds Results(orig_img, path, names, boxes)",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
