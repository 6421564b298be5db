"""Validation's per-image bookkeeping: the matching operator (``ops/match_predictions.py``) against stock's
``match_predictions`` and the numpy reference, the ``val_matching`` patch's probe, and ``val_metrics``' host copies
(``patches/val_metrics.py``): on a GPU, stock's ``update_metrics`` on device tensors and the patched one on host copies
collect the same statistics, array for array; on the CPU, the batch-wide answers to stock's per-image helpers against
those helpers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ultralytics.engine.validator import BaseValidator
from ultralytics.models.yolo.detect import DetectionValidator
from ultralytics.models.yolo.segment import SegmentationValidator
from ultralytics.utils import ops
from ultralytics.utils.metrics import box_iou

from yolo_fastdetect.ops import match_predictions
from yolo_fastdetect.ops.match_predictions import match_predictions_reference
from yolo_fastdetect.patches import val_matching, val_metrics
from yolo_fastdetect.patches._patching import Declined

THRESHOLDS = val_matching.IOU_THRESHOLDS
HOLDER = SimpleNamespace(iouv=THRESHOLDS)  # what a matching method reads of its validator


def stock_matching(pred_classes: torch.Tensor, true_classes: torch.Tensor, iou: torch.Tensor) -> torch.Tensor:
    """Stock's ``BaseValidator.match_predictions`` (greedy), called on :data:`HOLDER`."""
    return val_matching.PATCH.original("match_predictions")(HOLDER, pred_classes, true_classes, iou)


def random_case(generator: torch.Generator, labels: int, detections: int, grid: bool):
    """(pred_classes, true_classes, iou): three classes, IoU continuous or on a grid of twentieths (ties, values on
    the thresholds), a third of the pairs not overlapping."""
    iou = torch.rand(labels, detections, generator=generator)
    if grid:
        iou = torch.round(iou * 20) / 20
    iou *= torch.rand(labels, detections, generator=generator) > 0.33
    pred_classes = torch.randint(0, 3, (detections,), generator=generator).float()
    true_classes = torch.randint(0, 3, (labels,), generator=generator).float()
    return pred_classes, true_classes, iou


@pytest.fixture(autouse=True)
def stock_methods():
    """Each test starts with stock's methods (the patches' records of them made) and leaves them so."""
    for patch in (val_matching, val_metrics):
        assert patch.apply(), patch.PATCH.state()
        patch.revert()
    yield
    val_matching.revert()
    val_metrics.revert()


def test_operator_is_stocks_matching(generator):
    """Non-square cases from empty to 300 detections (conf 0.001's maximum): the operator, the reference and the
    patched method all give stock's (N, 10) bool tensor."""
    val_matching.apply()
    assert val_matching.is_applied()
    validator = DetectionValidator()
    validator.iouv = THRESHOLDS
    shapes = [(0, 5), (4, 0), (1, 1), (7, 3), (3, 40), (25, 300)] + [
        tuple(torch.randint(1, 30, (2,), generator=generator).tolist()) for _ in range(40)]
    for index, (labels, detections) in enumerate(shapes):
        pred_classes, true_classes, iou = random_case(generator, labels, detections, grid=index % 2 == 0)
        expected = stock_matching(pred_classes, true_classes, iou)
        masked = val_matching.class_masked(pred_classes, true_classes, iou)
        assert expected.dtype == torch.bool and expected.shape == (detections, len(THRESHOLDS))
        assert torch.equal(match_predictions(masked, THRESHOLDS), expected), (labels, detections)
        assert np.array_equal(match_predictions_reference(masked.numpy(), THRESHOLDS.numpy()), expected.numpy())
        assert torch.equal(validator.match_predictions(pred_classes, true_classes, iou), expected)
    assert val_matching.is_applied()


def test_operator_follows_numpy_on_nan_and_unordered_thresholds(generator):
    """A NaN IoU is numpy's argmax (the first NaN) and is never correct; a NaN threshold leaves every detection
    incorrect (numpy's min is NaN); thresholds in any order."""
    pred_classes, true_classes, iou = random_case(generator, 6, 17, grid=True)
    iou[torch.rand(iou.shape, generator=generator) < 0.1] = float("nan")
    for thresholds in (THRESHOLDS, THRESHOLDS.flip(0), torch.tensor([0.5, float("nan"), 0.7])):
        expected = match_predictions_reference(iou.numpy(), thresholds.numpy())
        assert np.array_equal(match_predictions(iou, thresholds).numpy(), expected)
    assert torch.equal(match_predictions(iou, THRESHOLDS), stock_matching(torch.zeros(17), torch.zeros(6), iou))
    assert not match_predictions(iou, torch.tensor([0.5, float("nan")])).any()


@pytest.mark.parametrize(
    ("iou", "thresholds", "error", "message"),
    [
        (torch.zeros(4), THRESHOLDS, ValueError, "iou must be"),
        (torch.zeros(2, 3), torch.zeros(2, 2), ValueError, "thresholds must be"),
        (torch.zeros(2, 3, dtype=torch.float64), THRESHOLDS, TypeError, "iou must be float32"),
        (torch.zeros(2, 3), THRESHOLDS.half(), TypeError, "thresholds must be float32"),
    ],
)
def test_operator_rejects_bad_input(iou, thresholds, error, message):
    with pytest.raises(error, match=message):
        match_predictions(iou, thresholds)


@pytest.mark.cuda
def test_operator_names_a_gpu_argument():
    with pytest.raises(ValueError, match="iou must be on the CPU"):
        match_predictions(torch.zeros(2, 3, device="cuda"), THRESHOLDS)


def sorted_by_iou_matching(self, pred_classes, true_classes, iou, use_scipy=False):
    """Ultralytics' matching before the greedy form: at each threshold, the pairs that reach it sorted by IoU, then
    one per detection and one per label."""
    iou = val_matching.class_masked(pred_classes, true_classes, iou).numpy()
    correct = np.zeros((len(pred_classes), len(self.iouv)), dtype=bool)
    for column, threshold in enumerate(self.iouv.tolist()):
        matches = np.array(np.nonzero(iou >= threshold)).T
        if len(matches) > 1:
            matches = matches[iou[matches[:, 0], matches[:, 1]].argsort()[::-1]]
            matches = matches[np.unique(matches[:, 1], return_index=True)[1]]
            matches = matches[np.unique(matches[:, 0], return_index=True)[1]]
        correct[matches[:, 1].astype(int), column] = True
    return torch.from_numpy(correct)


def test_matching_patch_declines_where_stock_matches_otherwise(monkeypatch):
    """The plan's probe tells the greedy walk from the older sorted matching, so releases with the older one keep
    theirs."""
    assert any(not torch.equal(sorted_by_iou_matching(HOLDER, *case),
                               stock_matching(*case)) for case in val_matching.probe_cases())
    monkeypatch.setattr(BaseValidator, "match_predictions", sorted_by_iou_matching)
    with pytest.raises(Declined, match="greedily"):
        val_matching._plan()


def random_predictions(generator: torch.Generator, dtype: torch.dtype, counts: list[int]) -> list[dict]:
    """Stock's per-image prediction dicts (boxes, confidences, classes, and keypoints as a second trailing shape)."""
    return [{"bboxes": torch.rand(count, 4, generator=generator).to(dtype) * 640,
             "conf": torch.rand(count, generator=generator).to(dtype),
             "cls": torch.randint(0, 80, (count,), generator=generator).to(dtype),
             "keypoints": torch.randn(count, 17, 3, generator=generator).to(dtype)} for count in counts]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_host_predictions_round_trip(generator, dtype):
    """Every field of every image back with its shape, dtype and values, images without detections included."""
    preds = random_predictions(generator, dtype, [3, 0, 11, 1, 0])
    copies = val_metrics.host_predictions(preds)
    assert len(copies) == len(preds)
    for copy, pred in zip(copies, preds):
        assert list(copy) == list(pred)
        for name, value in pred.items():
            assert copy[name].dtype == value.dtype and copy[name].shape == value.shape, name
            assert torch.equal(copy[name], value), name
    assert val_metrics.host_predictions([]) == [] and val_metrics.host_predictions([{}]) == [{}]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_host_predictions_of_one_padded_output(generator, dtype):
    """Rows viewing one padded (B, max_det, 6) tensor, as the NMS operator returns them, travel as that tensor and
    come back as the same views; rows viewing two tensors take the per-image copy."""
    padded = torch.rand(5, 300, 6, generator=generator).to(dtype)
    counts = torch.randint(0, 301, (5,), generator=generator).tolist() + [0]
    rows = [image[:count] for image, count in zip(padded.unbind(0), counts)]
    for preds in ([{"bboxes": x[:, :4], "conf": x[:, 4], "cls": x[:, 5], "extra": x[:, 6:]} for x in rows],
                  [{"bboxes": x[:, :4], "conf": x[:, 4].clone(), "cls": x[:, 5]} for x in rows]):
        assert (val_metrics.shared_storage(preds) is not None) == ("extra" in preds[0])
        for copy, pred in zip(val_metrics.host_predictions(preds), preds):
            for name, value in pred.items():
                assert copy[name].dtype == value.dtype and copy[name].shape == value.shape, name
                assert torch.equal(copy[name], value), name


def test_label_counts_need_labels_grouped_in_order():
    assert val_metrics.label_counts(torch.tensor([0.0, 0.0, 1.0, 3.0]), 4) == [2, 1, 0, 1]
    assert val_metrics.label_counts(torch.zeros(0), 2) == [0, 0]
    for batch_idx in ([1.0, 0.0], [0.0, 2.0], [-1.0, 0.0], [0.5, 1.0]):
        assert val_metrics.label_counts(torch.tensor(batch_idx), 2) is None, batch_idx


def host_validator() -> DetectionValidator:
    """A validator on the CPU answering :func:`random_batch`'s images, as ``update_metrics`` on host copies sees it."""
    validator = validator_with_metrics("cpu")
    validator.iouv, validator.niou = THRESHOLDS, len(THRESHOLDS)
    return validator


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_batch_answers_are_stocks_helpers(generator, dtype):
    """Stock's ``_prepare_batch`` and ``_process_batch`` image by image against the batch-wide answers on the same
    host batches (labels on an image without detections, detections on one without labels, up to 300): equal field
    for field, the IoU equal to stock's ``box_iou``, the same true positives."""
    val_matching.apply()
    validator = host_validator()
    for _ in range(3):
        preds, batch = random_batch(generator, "cpu", dtype)
        # A label a thousandth of a pixel wide and a detection on it: an IoU where box_iou's epsilon counts.
        batch["bboxes"][0, 2:] = 1e-6
        preds[0]["bboxes"][0] = (ops.xywh2xyxy(batch["bboxes"][:1]) * torch.tensor([640, 480, 640, 480]))[0]
        answers = val_metrics.BatchAnswers(validator, preds, batch, val_metrics.label_counts(batch["batch_idx"], 4),
                                           1e-7)
        for si, pred in enumerate(preds):
            stock = DetectionValidator._prepare_batch(validator, si, batch)
            ours = answers.prepare_batch(si, batch)
            assert list(ours) == list(stock)
            for key, value in stock.items():
                assert torch.equal(ours[key], value) if isinstance(value, torch.Tensor) else ours[key] == value, key
            if len(stock["cls"]) and len(pred["cls"]):
                assert torch.equal(answers.iou[si, :len(stock["cls"]), :len(pred["cls"])],
                                   box_iou(stock["bboxes"], pred["bboxes"]))
            expected = DetectionValidator._process_batch(validator, pred, stock)["tp"]
            assert np.array_equal(answers.process_batch(pred, ours)["tp"], expected)
            # Arguments that are not the batch's own go to stock's method.
            assert np.array_equal(answers.process_batch(dict(pred), stock)["tp"], expected)


def test_update_metrics_with_batch_answers_is_stocks(generator, monkeypatch):
    """The patched ``update_metrics`` on the CPU (as it runs on the host copies) collects stock's statistics and
    leaves the validator's own helpers in place."""
    batches = [random_batch(generator, "cpu", torch.float32) for _ in range(3)]
    monkeypatch.setattr(val_metrics, "host_copies_apply", lambda validator, preds: True)
    collected = []
    for patched in (False, True):
        for patch in (val_metrics, val_matching):
            patch.apply() if patched else patch.revert()
        validator = host_validator()
        for preds, batch in batches:
            validator.update_metrics([dict(pred) for pred in preds], batch)
        assert "_prepare_batch" not in vars(validator) and "_process_batch" not in vars(validator)
        collected.append(validator)
    stock, ours = collected
    assert sum(int(tp.sum()) for tp in stock.metrics.stats["tp"]) > 0, "the batches should match some labels"
    for key, arrays in stock.metrics.stats.items():
        assert len(ours.metrics.stats[key]) == len(arrays), key
        assert all(np.array_equal(mine, theirs) for mine, theirs in zip(ours.metrics.stats[key], arrays)), key
    assert np.array_equal(ours.confusion_matrix.matrix, stock.confusion_matrix.matrix)


def test_plan_keeps_stocks_helpers_where_they_answer_otherwise(monkeypatch):
    """A release whose ``_prepare_batch`` scales its labels otherwise: the plan still patches (host copies) but
    finds the batch-wide answers unequal, and ``update_metrics`` runs the release's helpers."""
    assert val_metrics.answers_match_stock(1e-7)
    stock = DetectionValidator._prepare_batch
    prepared = []

    def rounded(self, si, batch):
        prepared.append(si)
        answer = stock(self, si, batch)
        return {**answer, "bboxes": answer["bboxes"].round()}

    monkeypatch.setattr(DetectionValidator, "_prepare_batch", rounded)
    monkeypatch.setattr(val_metrics, "_answers_eps", val_metrics._answers_eps)  # restored after the test
    assert not val_metrics.answers_match_stock(1e-7)
    assert val_metrics._plan() and val_metrics._answers_eps is None
    monkeypatch.setattr(val_metrics, "host_copies_apply", lambda validator, preds: True)
    prepared.clear()
    val_metrics.update_metrics(host_validator(), *random_batch(torch.Generator().manual_seed(0), "cpu", torch.float32))
    assert prepared == [0, 1, 2, 3]


def test_host_copies_apply_only_to_plain_detection_on_a_gpu(generator):
    preds = random_predictions(generator, torch.float32, [2, 0])
    validator = DetectionValidator(args={"single_cls": False})
    validator.device = torch.device("cuda")
    assert val_metrics.host_copies_apply(validator, preds)
    for change in ({"single_cls": True}, {"save_json": True}, {"save_txt": True}):
        assert not val_metrics.host_copies_apply(DetectionValidator(args=change), preds), change
    validator.device = torch.device("cpu")
    assert not val_metrics.host_copies_apply(validator, preds)
    segmentation = SegmentationValidator()
    segmentation.device = torch.device("cuda")
    assert not val_metrics.host_copies_apply(segmentation, preds)  # it reads its masks from the device
    validator.device = torch.device("cuda")
    assert not val_metrics.host_copies_apply(validator, [{"cls": torch.zeros(2, dtype=torch.int64)}])
    assert not val_metrics.host_copies_apply(validator, torch.zeros(2, 6))


def validator_with_metrics(device: str) -> DetectionValidator:
    """A detection validator ready for ``update_metrics`` (as ``init_metrics`` leaves it) on ``device``."""
    from ultralytics.utils.metrics import ConfusionMatrix, DetMetrics

    validator = DetectionValidator(args={"plots": True, "conf": 0.001})
    validator.device, validator.training = torch.device(device), False
    validator.names, validator.nc, validator.seen = {i: str(i) for i in range(3)}, 3, 0
    validator.is_coco = validator.is_lvis = validator.is_custom_json = validator.build_gdict = False
    validator.metrics = DetMetrics(names=validator.names)
    validator.confusion_matrix = ConfusionMatrix(names=validator.names)
    return validator


def random_batch(generator: torch.Generator, device: str, dtype: torch.dtype):
    """A batch of four images of 480x640 with labels (none on one image), and detections near them."""
    counts, labels = [5, 0, 40, 300], [3, 2, 0, 9]
    preds = []
    boxes = []
    for count, label_count in zip(counts, labels):
        centres = torch.rand(label_count, 2, generator=generator) * 0.6 + 0.2
        sizes = torch.rand(label_count, 2, generator=generator) * 0.3 + 0.05
        boxes.append(torch.cat([centres, sizes], 1))
        xyxy = torch.rand(count, 4, generator=generator) * 400
        xyxy[:, 2:] += xyxy[:, :2]
        preds.append({"bboxes": xyxy.to(device, dtype), "conf": torch.rand(count, generator=generator).sort(
            descending=True).values.to(device, dtype), "cls": torch.randint(0, 3, (count,), generator=generator)
                      .to(device, dtype)})
    batch = {"img": torch.zeros(4, 3, 480, 640, device=device), "batch_idx": torch.cat(
        [torch.full((n,), i, dtype=torch.float32) for i, n in enumerate(labels)]).to(device),
        "cls": torch.randint(0, 3, (sum(labels), 1), generator=generator).float().to(device),
        "bboxes": torch.cat(boxes).to(device), "ori_shape": [(480, 640)] * 4,
        "ratio_pad": [((1.0, 1.0), (0.0, 0.0))] * 4, "im_file": [f"{i}.jpg" for i in range(4)]}
    # Detections on the labels, jittered, so that some match at each threshold.
    for image, pred in enumerate(preds):
        own = batch["bboxes"][batch["batch_idx"] == image]
        if len(own) and len(pred["cls"]):
            xyxy = torch.cat([own[:, :2] - own[:, 2:] / 2, own[:, :2] + own[:, 2:] / 2], 1) * torch.tensor(
                [640, 480, 640, 480], device=device)
            picks = min(len(own) * 2, len(pred["cls"]))
            jitter = torch.randn(picks, 4, generator=generator).to(device) * 6
            pred["bboxes"][:picks] = (xyxy.repeat(2, 1)[:picks] + jitter).to(dtype)
    return preds, batch


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_update_metrics_on_host_copies_is_stocks(generator, dtype):
    """Stock's ``update_metrics`` on the GPU's tensors, then the patched one (host copies, the matching operator) on
    the same batches: the same statistics and confusion matrix, exactly."""
    batches = [random_batch(generator, "cuda", dtype) for _ in range(3)]
    collected = []
    for patched in (False, True):
        for patch in (val_metrics, val_matching):
            patch.apply() if patched else patch.revert()
        validator = validator_with_metrics("cuda")
        for preds, batch in batches:
            validator.update_metrics([dict(pred) for pred in preds], batch)
        collected.append(validator)
    stock, ours = collected
    assert sum(int(tp.sum()) for tp in stock.metrics.stats["tp"]) > 0, "the batches should match some labels"
    for key, arrays in stock.metrics.stats.items():
        assert len(ours.metrics.stats[key]) == len(arrays), key
        for mine, theirs in zip(ours.metrics.stats[key], arrays):
            assert np.array_equal(mine, theirs), key
    assert np.array_equal(ours.confusion_matrix.matrix, stock.confusion_matrix.matrix)
