"""Batched NMS: the operator against the stock Ultralytics function and the pure-PyTorch reference, the Ultralytics
patch, and end-to-end predict/val parity."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch

from conftest import asset_images, detecting_model, devices, write_tiny_dataset
from yolo_fastdetect import _ext
from yolo_fastdetect.ops.nms import (
    BatchDetections,
    batched_nms,
    non_max_suppression,
    non_max_suppression_reference,
    stock_non_max_suppression,
)

pytestmark = pytest.mark.skipif(not _ext.available(), reason="operators not built")

IMAGE_SIZE = 640


def make_prediction(
    generator: torch.Generator,
    batch: int,
    num_classes: int = 4,
    num_extra: int = 0,
    num_anchors: int = 600,
    dtype: torch.dtype = torch.float32,
    distinct_scores: bool = False,
) -> torch.Tensor:
    """A head output ``(B, 4 + nc + nm, A)`` that looks like a trained model's.

    Per image: background anchors with random boxes and low scores spread down to 0, and 0 to 6 objects of a few
    classes, each a cluster of overlapping boxes around the object with scores spread over [0.2, 1].
    Float32 scores never tie within an image (:func:`untie`). ``distinct_scores`` replaces every score by a distinct
    multiple of 1/2048 (same ranks), exact in float16, so that the order of equal scores, which stock leaves to an
    unstable sort, never matters in that dtype either; float32 images of 2048 scores or more take multiples of 2^-20
    instead (exact in float32).
    """

    def uniform(*shape, low=0.0, high=1.0):
        return torch.rand(*shape, generator=generator) * (high - low) + low

    prediction = torch.empty(batch, 4 + num_classes + num_extra, num_anchors)
    prediction[:, 0:2] = uniform(batch, 2, num_anchors, high=IMAGE_SIZE)
    prediction[:, 2:4] = uniform(batch, 2, num_anchors, low=2, high=160)
    prediction[:, 4 : 4 + num_classes] = uniform(batch, num_classes, num_anchors) ** 6 * 0.4
    prediction[:, 4 + num_classes :] = torch.randn(batch, num_extra, num_anchors, generator=generator)
    image_classes = min(num_classes, 3)
    for image in range(batch):
        classes = torch.randperm(num_classes, generator=generator)[:image_classes]
        for _ in range(int(torch.randint(0, 7, (1,), generator=generator))):
            shuffled = torch.randperm(num_anchors, generator=generator)
            members = shuffled[: int(torch.randint(3, 40, (1,), generator=generator))]
            centre, size = uniform(2, high=IMAGE_SIZE), uniform(2, low=16, high=300)
            jitter = uniform(4, len(members), low=-0.15, high=0.15)
            prediction[image, 0:2, members] = centre[:, None] + jitter[:2] * size[:, None]
            prediction[image, 2:4, members] = size[:, None] * (1 + jitter[2:])
            cls = classes[int(torch.randint(0, image_classes, (1,), generator=generator))]
            prediction[image, 4 + cls, members] = uniform(len(members), low=0.2, high=1.0)
    if distinct_scores:
        scores = prediction[:, 4 : 4 + num_classes].reshape(batch, -1)
        steps = 2048 if scores.shape[1] < 2048 else 1 << 20
        assert scores.shape[1] < steps and (steps == 2048 or dtype == torch.float32)
        for image in range(batch):
            grid = torch.randperm(steps - 1, generator=generator)[: scores.shape[1]].sort().values.float() + 1
            scores[image, scores[image].argsort()] = grid / steps
        prediction[:, 4 : 4 + num_classes] = scores.view(batch, num_classes, num_anchors)
    elif dtype == torch.float32:
        untie(prediction[:, 4 : 4 + num_classes])
    return prediction.to(dtype)


def untie(scores: torch.Tensor) -> None:
    """Make the float32 scores of each image ``(B, nc, A)`` distinct, in place, by moving each repeated value up by
    as many ulps as it takes (ranks between distinct values are kept).

    Random float32 scores do tie (torch.rand draws multiples of 2^-24): the 64-image 2100-anchor stock case held
    tied candidates at every seed tried, and where max_det cut through such a tie, stock's unstable sort kept the
    other box (1 of 70 seeds; CI failed so once in the every-anchor case, seed 2612121647).
    """
    for image in scores:
        flat = image.view(-1)
        order = flat.argsort(stable=True)
        ordered = flat[order]
        repeated = ordered[1:] == ordered[:-1]
        while repeated.any():  # a bumped value may meet the next one: bump again, the order stays ascending
            later = ordered[1:]
            later[repeated] = torch.nextafter(later[repeated], torch.tensor(math.inf))
            repeated = ordered[1:] == ordered[:-1]
        flat[order] = ordered


def canonical(detections: torch.Tensor) -> torch.Tensor:
    """Rows ordered by descending score, rows of equal score by their values: equal scores compare as sets."""
    keys = sorted(range(len(detections)), key=lambda row: (-detections[row, 4].item(), detections[row].tolist()))
    return detections[keys]


def assert_same_detections(ours: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(ours) == len(expected)
    for image, (mine, theirs) in enumerate(zip(ours, expected)):
        assert mine.dtype == theirs.dtype == torch.float32, image
        assert mine.shape == theirs.shape, f"image {image}: {tuple(mine.shape)} != {tuple(theirs.shape)}"
        assert torch.all(mine[1:, 4] <= mine[:-1, 4]), f"image {image}: not in descending score"
        torch.testing.assert_close(canonical(mine.cpu()), canonical(theirs.cpu()), rtol=0, atol=0, msg=f"image {image}")


def assert_matches_stock(prediction: torch.Tensor, **options) -> list[torch.Tensor]:
    """Checks that the operator's detections for ``prediction`` equal stock's (as sets where scores tie).

    Stock runs without its time limit: on a slow machine it would stop early and leave later images empty.

    Returns:
        The operator's detections, for checks of their own.
    """
    ours = non_max_suppression(prediction, **options)
    assert_same_detections(ours, stock_non_max_suppression(prediction, **options, max_time_img=1e9))
    return ours


def assert_matches_reference(prediction: torch.Tensor, **options) -> None:
    """Checks that the operator's detections equal the reference's exactly, order included: the reference breaks
    score ties by anchor and class as the operator does."""
    ours = non_max_suppression(prediction, **options)
    reference = non_max_suppression_reference(prediction.cpu(), **options)
    assert len(ours) == len(reference)
    for mine, theirs in zip(ours, reference):
        torch.testing.assert_close(mine.cpu(), theirs, rtol=0, atol=0)


OPTIONS = [
    {},
    {"multi_label": True},
    {"agnostic": True},
    {"classes": [0, 2]},
    {"multi_label": True, "agnostic": True, "classes": [1, 3, 7]},
    {"max_det": 5},
    {"max_nms": 20},
    {"multi_label": True, "max_nms": 50, "max_det": 17},
    {"conf_thres": 0.001, "iou_thres": 0.7, "multi_label": True},
    {"conf_thres": 0.0, "iou_thres": 0.0},
    {"iou_thres": 1.0, "max_wh": 100},
]


def options_id(options: dict) -> str:
    """A readable test id for NMS options: ``multi_label=True-max_det=5``, or ``default`` for none."""
    return "-".join(f"{k}={v}" for k, v in options.items()) or "default"


def stock_samples() -> list:
    """The cases test_matches_stock compares with stock, as (``make_prediction`` keywords, NMS options) pairs.

    Every option set on float32 at batch 1 and 5; batches up to 64 of 2100 anchors, single- and multi-label; float16
    with distinct scores (exact in float16), so that stock's unstable sort of equal scores decides nothing.
    """
    cases = [(f"float32-b{batch}", {"batch": batch, "num_extra": 3}, {"nc": 4, **options})
             for batch in (1, 5) for options in OPTIONS]
    # Lower multi-label thresholds make the stock function too slow at 2100 anchors.
    cases += [(f"float32-b{batch}-a2100", {"batch": batch, "num_classes": 6, "num_anchors": 2100},
               {"conf_thres": 0.2 if multi_label else 0.25, "iou_thres": 0.7, "multi_label": multi_label})
              for batch in (1, 16, 64) for multi_label in (False, True)]
    float16 = {"batch": 6, "num_classes": 3, "num_extra": 2, "dtype": torch.float16, "distinct_scores": True}
    cases += [("float16-b6", float16, {"nc": 3, **options}) for options in OPTIONS[:5]]
    return [pytest.param(make, options, id=f"{name}-{options_id(options)}") for name, make, options in cases]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("make, options", stock_samples())
def test_matches_stock(generator, device, make, options):
    assert_matches_stock(make_prediction(generator, **make).to(device), **options)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=options_id)
def test_matches_reference(generator, device, dtype, options):
    assert_matches_reference(make_prediction(generator, 3, num_extra=2, dtype=dtype).to(device), nc=4, **options)


@pytest.mark.parametrize("device", devices())
def test_empty_images_and_indices(generator, device):
    prediction = make_prediction(generator, 4, num_extra=1)
    prediction[1, 4:8] = 0.1  # nothing passes conf 0.25
    prediction[3, 4:8] = 0.0
    prediction = prediction.to(device)
    ours, our_indices = non_max_suppression(prediction, nc=4, return_idxs=True)
    stock, stock_indices = stock_non_max_suppression(prediction, nc=4, return_idxs=True)
    assert_same_detections(ours, stock)
    for mine, theirs in zip(our_indices, stock_indices):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape and mine.device == theirs.device
        assert torch.equal(mine, theirs)
    empty = non_max_suppression(torch.zeros(2, 8, 50, device=device), return_idxs=True)
    assert [tuple(d.shape) for d in empty[0]] == [(0, 6)] * 2 and all(i.shape == (0, 1) for i in empty[1])


@pytest.mark.parametrize("device", devices())
def test_every_anchor_passes_and_more_than_max_nms(generator, device):
    # Distinct scores: make_prediction's float32 scores are untied, but halving and shifting them (below) rounds
    # near-equal small scores onto one float, and where max_det or max_nms cuts through a tie, stock's unstable sort
    # picks any of its members (CI failed so, seed 2612121647). Multiples of 2^-20, halved and shifted, are at least
    # 8 float32 ulps apart in [0.3, 0.8), so they stay distinct.
    prediction = make_prediction(generator, 3, num_anchors=3000, distinct_scores=True)
    prediction[:, 4:8] = prediction[:, 4:8] * 0.5 + 0.3  # every score above conf
    prediction = prediction.to(device)
    for options in ({}, {"max_nms": 100}, {"multi_label": True, "max_nms": 1000}, {"agnostic": True, "max_nms": 7}):
        assert_matches_stock(prediction, **options)


@pytest.mark.parametrize("device", devices())
def test_exact_score_ties(generator, device):
    """Tied scores on identical duplicate boxes (either suppresses the other) and on far-apart boxes."""
    prediction = make_prediction(generator, 2, num_extra=2)
    prediction[:, :, 100:200] = prediction[:, :, 0:100]  # duplicates of the first 100 anchors
    prediction[:, 4:8, 300:400] = 0.75  # the same score on 100 anchors ...
    prediction[:, 0, 300:400] = torch.arange(100) * 50.0  # ... whose boxes do not overlap
    prediction[:, 1, 300:400] = 20.0
    prediction[:, 2:4, 300:400] = 10.0
    prediction = prediction.to(device)
    # Stock's unstable sort picks arbitrary members of a tie group cut by max_det or max_nms: only the reference,
    # which breaks ties by anchor and class, is compared where a cut can fall inside one.
    for options in ({}, {"multi_label": True}, {"agnostic": True}):
        assert_matches_stock(prediction, nc=4, max_det=1000, **options)
    for options in ({}, {"multi_label": True}, {"max_nms": 150}, {"multi_label": True, "max_det": 120}):
        assert_matches_reference(prediction, nc=4, **options)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_best_class_at_the_edges_of_the_cpu_scan_blocks(generator, device, dtype):
    """The head's real size (8400 anchors, 80 classes; the CPU kernel scans anchors in blocks of 256, class by class):
    tied best scores (the first class wins, as torch.max) and NaN scores on anchors at the edges of the blocks, one
    layout with the anchors contiguous and one strided."""
    prediction = make_prediction(generator, 2, num_classes=80, num_anchors=8400, dtype=dtype)
    edges = torch.tensor([0, 255, 256, 257, 511, 512, 4095, 4096, 8191, 8192, 8399])
    prediction[:, 4:, edges] = 0.0
    prediction[:, 4 + 70, edges] = 0.625  # exact in every dtype: the tie below is a tie after the conversion
    prediction[:, 4 + 3, edges] = 0.625
    prediction[:, 4 + 79, edges[::3]] = math.nan  # these anchors have a passing score and a NaN: dropped
    prediction[:, 2:4, edges] = 8.0  # small boxes: tiles far apart do not suppress each other
    strided = prediction.transpose(1, 2).contiguous().transpose(1, 2)
    for layout in (prediction.to(device), strided.to(device)):
        for options in ({}, {"multi_label": True, "conf_thres": 0.3}):
            assert_matches_reference(layout, **options)


@pytest.mark.parametrize("device", devices())
def test_zero_area_boxes(generator, device):
    prediction = make_prediction(generator, 2)
    prediction[:, 2, ::3] = 0.0  # zero width
    prediction[:, 3, ::5] = 0.0  # zero height
    prediction[:, :4, 10:20] = prediction[:, :4, 10:11]  # the same point box ten times
    prediction[:, 2:4, 10:20] = 0.0
    prediction[:, 4, 10:20] = torch.linspace(0.5, 0.9, 10)
    prediction = prediction.to(device)
    for options in ({}, {"agnostic": True}, {"iou_thres": 0.0}):
        assert_matches_stock(prediction, **options)


@pytest.mark.parametrize("device", devices())
def test_nan_scores_are_dropped(generator, device):
    prediction = make_prediction(generator, 2)
    prediction[0, 5, ::7] = math.nan
    prediction[1, 4:8, ::4] = math.nan
    prediction = prediction.to(device)
    for options in ({}, {"multi_label": True}):
        ours = assert_matches_stock(prediction, **options)
        assert not any(d.isnan().any() for d in ours)


@pytest.mark.parametrize("device", devices())
def test_strided_and_degenerate_shapes(generator, device):
    """A prediction laid out (B, A, C) and transposed, an empty batch, and images without anchors."""
    prediction = make_prediction(generator, 3, num_extra=2).to(device)
    strided = prediction.transpose(1, 2).contiguous().transpose(1, 2)
    assert not strided.is_contiguous()
    assert_same_detections(non_max_suppression(strided, nc=4, multi_label=True),
                           stock_non_max_suppression(prediction, nc=4, multi_label=True))
    assert non_max_suppression(prediction[:0]) == []
    no_anchors = non_max_suppression(torch.rand(2, 10, 0, device=device), nc=4)
    assert [tuple(d.shape) for d in no_anchors] == [(0, 8)] * 2


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nonfinite_box_coordinates_match_stock(generator, device, value):
    """Boxes with NaN or infinite coordinates: the same detections as stock (which torchvision's kernels decide)."""
    prediction = make_prediction(generator, 3, num_anchors=400, distinct_scores=True).to(device)
    anchors = torch.randint(0, prediction.shape[2], (40,), generator=generator)
    for row in range(4):
        prediction[row % 3, row, anchors[row * 10 : row * 10 + 10]] = value
    assert not torch.isfinite(prediction[:, :4]).all()
    ours, stock = non_max_suppression(prediction, nc=4), stock_non_max_suppression(prediction, nc=4)
    assert len(ours) == len(stock)
    for mine, theirs in zip(ours, stock):  # kept boxes may hold NaN: compared as equal where both do
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("multi_label", [False, True])
def test_huge_max_det_and_no_max_nms_match_stock(generator, device, multi_label):
    """max_det=10**9 returns what there is, as stock (the output was allocated for max_det rows per image: the
    process was killed for memory); max_nms=0 keeps nothing, as stock's [:0]."""
    prediction = make_prediction(generator, 4, num_extra=2, num_anchors=400, distinct_scores=True).to(device)
    for options in ({"max_det": 10**9}, {"max_det": 10**9, "max_nms": 50}, {"max_nms": 0}):
        assert_matches_stock(prediction, nc=4, multi_label=multi_label, conf_thres=0.05, **options)
    assert all(len(d) == 0 for d in non_max_suppression(prediction, nc=4, max_nms=0))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"conf_thres": -0.1}, "conf_thres"),
        ({"conf_thres": 1.5}, "conf_thres"),
        ({"conf_thres": math.nan}, "conf_thres"),
        ({"iou_thres": -0.01}, "iou_thres"),
        ({"iou_thres": 2.0}, "iou_thres"),
        ({"max_det": 0}, "max_det"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        non_max_suppression(torch.rand(1, 8, 50), **kwargs)
    with pytest.raises(ValueError, match=message):
        batched_nms(torch.rand(1, 8, 50), 4, **kwargs)


def test_bad_prediction_shapes():
    with pytest.raises(ValueError, match="prediction"):
        non_max_suppression(torch.rand(8, 50))
    with pytest.raises(ValueError, match="prediction"):
        batched_nms(torch.rand(8, 50), 4)
    with pytest.raises(ValueError, match="num_classes"):
        batched_nms(torch.rand(1, 8, 50), 5)
    with pytest.raises(TypeError, match="float32"):
        batched_nms(torch.rand(1, 8, 50, dtype=torch.float64), 4)


def test_messages_format_shapes_and_numbers():
    """Checks format numbers without iostreams (csrc/common.h says why), reading as torch prints them."""
    with pytest.raises(ValueError, match=r"got \[8, 50\]"):
        batched_nms(torch.rand(8, 50), 4)
    with pytest.raises(ValueError, match=r"in \[1, 4\] for prediction with 8 channels, got 5"):
        batched_nms(torch.rand(1, 8, 50), 5)
    with pytest.raises(ValueError, match="got -1e-07"):
        batched_nms(torch.rand(1, 8, 50), 4, iou_thres=-1e-7)


@pytest.mark.parametrize("device", devices())
def test_the_output_carries_its_padded_tensor(generator, device):
    """The drop-in's list of rows carries the padded tensor they are views of, only while it holds those rows; a copy
    or a pickle is a plain list of the same rows, and the stock path returns stock's plain list."""
    prediction = make_prediction(generator, 3, num_anchors=700).to(device)
    rows, indices = non_max_suppression(prediction, nc=4, max_det=50, return_idxs=True)
    assert isinstance(rows, BatchDetections) and len(rows) == len(indices) == 3
    padded = rows.padded_rows()
    assert padded is rows.padded and padded.shape == (3, 50, 6) and padded.device == prediction.device
    assert all(row.data_ptr() == padded[i].data_ptr() and torch.equal(row, padded[i, : len(row)])
               for i, row in enumerate(rows))
    assert_same_detections(rows, stock_non_max_suppression(prediction, nc=4, max_det=50))
    for other in (copy.copy(rows), copy.deepcopy(rows), pickle.loads(pickle.dumps(rows)), rows[:]):
        assert type(other) is list and len(other) == 3 and all(torch.equal(a, b) for a, b in zip(other, rows))
    rows.append(rows[0])
    assert rows.padded_rows() is None  # a fourth image's rows that the padded tensor does not hold
    del rows[3]
    assert rows.padded_rows() is padded
    rows[2] = rows[2].clone()
    assert rows.padded_rows() is None
    nonfinite = prediction.clone()
    nonfinite[0, 0, 0] = math.nan  # handed to the stock function
    assert type(non_max_suppression(nonfinite, nc=4)) is list


def test_stock_handles_end2end_rotated_and_double(generator):
    end2end = torch.rand(2, 300, 6, generator=generator)
    rotated = make_prediction(generator, 2, num_extra=1)  # the extra channel is the angle
    double = make_prediction(generator, 2).double()
    for prediction, options in ((end2end, {"end2end": True}), (rotated, {"nc": 4, "rotated": True}), (double, {})):
        ours = non_max_suppression(prediction, **options)
        for mine, theirs in zip(ours, stock_non_max_suppression(prediction, **options)):
            assert torch.equal(mine, theirs)


def test_opcheck(generator):
    prediction = make_prediction(generator, 2, num_extra=1)
    arguments = (prediction, 4, 0.25, 0.45, None, False, False, 30, 1000, 7680.0)
    torch.library.opcheck(torch.ops.yolo_fastdetect.batched_nms, arguments)


@pytest.mark.cuda
def test_cuda_matches_cpu_operator(generator):
    """The CUDA operator equals the CPU one bit for bit, padding included, for large batches and many candidates."""
    for dtype, multi_label, conf in ((torch.float32, False, 0.25), (torch.float16, True, 0.001),
                                     (torch.bfloat16, True, 0.05)):
        prediction = make_prediction(generator, 64, num_classes=80, num_extra=32, num_anchors=2100, dtype=dtype)
        cpu = batched_nms(prediction, 80, conf, 0.7, multi_label=multi_label, max_nms=3000)
        cuda = batched_nms(prediction.cuda(), 80, conf, 0.7, multi_label=multi_label, max_nms=3000)
        for mine, theirs in zip(cuda, cpu):
            assert torch.equal(mine.cpu(), theirs)


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 7])
def test_cuda_matches_cpu_operator_on_dense_overlapping_boxes(generator, batch):
    """Every anchor a candidate, in clusters of heavily overlapping boxes (as the seeded models of the benchmarks
    give): the CUDA operator's tiled suppression equals the CPU operator's plain greedy loop bit for bit. At IoU 0.45
    a few hundred boxes are kept from all 8400 candidates (every tile visited); max_det 3000 keeps the boxes outside
    shared memory. The thresholds are exact in float32 (the CPU compares in double, the GPU in float32: bfloat16
    boxes reach an IoU of 0.6 exactly)."""
    num_anchors, num_classes = 8400, 4
    prediction = make_prediction(generator, batch, num_classes=num_classes, num_anchors=num_anchors)
    centres = torch.rand(batch, 2, 40, generator=generator) * IMAGE_SIZE
    cluster = torch.randint(0, 40, (batch, num_anchors), generator=generator)
    for axis in range(2):
        jitter = torch.randn(batch, num_anchors, generator=generator) * 6
        prediction[:, axis] = centres[:, axis].gather(1, cluster) + jitter
    prediction[:, 2:4] = torch.rand(batch, 2, num_anchors, generator=generator) * 40 + 60
    prediction[:, 4:] = torch.rand(batch, num_classes, num_anchors, generator=generator) * 0.7 + 0.3
    for dtype, options in ((torch.float32, {"iou_thres": 0.45, "max_det": 3000}), (torch.float16, {"iou_thres": 0.7}),
                           (torch.float16, {"iou_thres": 0.7, "agnostic": True}),
                           (torch.bfloat16, {"iou_thres": 0.625, "multi_label": True, "max_nms": 20000})):
        cpu = batched_nms(prediction.to(dtype), num_classes, 0.25, **options)
        cuda = batched_nms(prediction.to(dtype).cuda(), num_classes, 0.25, **options)
        assert cpu[1].min() > 64, "too few kept boxes to span several tiles"
        for mine, theirs in zip(cuda, cpu):
            assert torch.equal(mine.cpu(), theirs), options


@pytest.mark.cuda
def test_cuda_graph_capture(generator):
    prediction = make_prediction(generator, 8, num_classes=80, num_anchors=2100).cuda()
    expected = batched_nms(prediction, 80)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = batched_nms(prediction, 80)
    graph.replay()
    torch.cuda.synchronize()
    for mine, theirs in zip(captured, expected):
        assert torch.equal(mine, theirs)


# ---- The Ultralytics patch and end-to-end parity ----


@pytest.fixture
def nms_patch():
    from yolo_fastdetect.patches import nms as nms_patch

    was_applied = nms_patch.is_applied()
    yield nms_patch
    nms_patch.apply() if was_applied else nms_patch.revert()


def test_patch_apply_revert(nms_patch):
    import ultralytics.utils.nms as ultralytics_nms

    nms_patch.revert()
    assert ultralytics_nms.non_max_suppression is stock_non_max_suppression and not nms_patch.is_applied()
    nms_patch.apply()
    nms_patch.apply()
    assert ultralytics_nms.non_max_suppression is non_max_suppression and nms_patch.is_applied()
    nms_patch.revert()
    assert ultralytics_nms.non_max_suppression is stock_non_max_suppression


def test_enable_disable_switch_the_nms(nms_patch):
    import yolo_fastdetect

    with yolo_fastdetect.disabled():
        assert not nms_patch.is_applied()
        assert yolo_fastdetect.enable() and nms_patch.is_applied()


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("config", ["yolo11n.yaml", "yolo11n-seg.yaml", "yolo11n-pose.yaml"])
def test_predict_same_results(nms_patch, device, config):
    """Detect, Segment (32 mask coefficients after the classes) and Pose (one class, 51 keypoint values)."""
    model = detecting_model(device, config)
    runs = {}
    for patched in (False, True):
        nms_patch.apply() if patched else nms_patch.revert()
        runs[patched] = model.predict(asset_images(), imgsz=320, device=device, verbose=False)
    assert nms_patch.is_applied()
    for stock, ours in zip(runs[False], runs[True]):
        assert len(stock.boxes) > 0
        assert_same_detections([ours.boxes.data], [stock.boxes.data])
        for extra in ("masks", "keypoints"):
            if getattr(stock, extra) is not None:
                assert torch.equal(getattr(ours, extra).data, getattr(stock, extra).data)


def test_val_same_metrics(nms_patch, tmp_path):
    model = detecting_model("cpu")
    data = write_tiny_dataset(tmp_path / "dataset", num_classes=80)
    metrics = {}
    for patched in (False, True):
        nms_patch.apply() if patched else nms_patch.revert()
        result = model.val(data=str(data), imgsz=320, batch=2, device="cpu", conf=0.25, plots=False, workers=0,
                           verbose=False, project=str(tmp_path / "runs"), name=f"patched{patched}")
        metrics[patched] = result.results_dict
    assert metrics[True]["metrics/recall(B)"] > 0
    assert metrics[True] == metrics[False]
