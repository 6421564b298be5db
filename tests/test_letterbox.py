"""Letterbox operator and scale_boxes_batch against stock Ultralytics (LetterBox, BasePredictor.preprocess,
scale_boxes): the model input must be bit-identical (torch.equal) on every device the test runs on."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from ultralytics.data.augment import LetterBox
from ultralytics.data.loaders import LoadPilAndNumpy
from ultralytics.engine.predictor import BasePredictor
from ultralytics.utils import ops as stock_ops

from conftest import asset_images, devices
from yolo_fastdetect import LetterboxGeometry, letterbox, letterbox_geometry, scale_boxes_batch

# The package exports the function under the module's name, so the module is imported by its full name.
letterbox_module = importlib.import_module("yolo_fastdetect.ops.letterbox")

# (height, width, new_shape, auto, scaleup, center, stride): odd widths, tiny, large, up- and downscaling, exact
# 2x both ways, an unchanged size (no resize), rectangular targets, the minimum rectangle, top-left placement.
CASES = [
    (3, 5, 640, False, True, True, 32),
    (1037, 1999, 640, False, True, True, 32),
    (1037, 1999, 640, True, True, True, 32),
    (1, 777, 640, False, True, True, 32),
    (481, 1, 320, False, True, True, 32),
    (320, 320, 640, False, True, True, 32),
    (1280, 1280, 640, False, True, True, 32),
    (640, 640, 640, False, True, True, 32),
    (480, 640, 640, True, True, True, 32),
    (479, 631, 640, False, True, False, 32),
    (479, 631, 640, True, True, False, 32),
    (201, 333, 640, False, False, True, 32),
    (901, 333, 640, False, False, True, 32),
    (721, 1283, (384, 640), False, True, True, 32),
    (721, 1283, (384, 640), True, True, True, 64),
    (97, 1111, (480, 352), False, True, True, 32),
]


def stock_input(images, new_shape=640, auto=False, scaleup=True, center=True, stride=32, dtype=torch.float32,
                device="cpu") -> torch.Tensor:
    """Stock LetterBox on each image, then stock BasePredictor.preprocess (upload, BGR->RGB, CHW, dtype, /255)."""
    transform = LetterBox(new_shape, auto=auto, scaleup=scaleup, center=center, stride=stride)
    predictor = SimpleNamespace(
        pre_transform=lambda batch: [transform(image=image) for image in batch],
        device=torch.device(device),
        model=SimpleNamespace(fp16=dtype == torch.float16),
    )
    return BasePredictor.preprocess(predictor, list(images))


def random_images(generator, count, height, width, channels=3) -> list[np.ndarray]:
    return [
        torch.randint(0, 256, (height, width, channels), dtype=torch.uint8, generator=generator).numpy()
        for _ in range(count)
    ]


def asset_arrays() -> list[np.ndarray]:
    return [cv2.imread(path) for path in asset_images()]


def mixed_images(generator) -> list[np.ndarray]:
    """One batch of many sizes: odd widths, 1 pixel tall and 1 pixel wide, tiny, large, a BGRA view (strided rows)
    large enough to be staged in several pieces, a mirrored view (negative strides), a read-only array, and the
    wheel's images."""
    sizes = [(3, 5), (1, 777), (481, 1), (97, 1111), (2003, 3001), (640, 640), (1037, 1999)]
    images = [image for height, width in sizes for image in random_images(generator, 1, height, width)]
    bgra = random_images(generator, 1, 1201, 1333, channels=4)[0]
    mirrored = random_images(generator, 1, 333, 517)[0][::-1, ::-1]
    read_only = random_images(generator, 1, 259, 401)[0]
    read_only.flags.writeable = False
    return [*images, LoadPilAndNumpy._single_check(bgra), mirrored, read_only, *asset_arrays(), bgra]


def op_inputs(images: list[np.ndarray], geometries: list[LetterboxGeometry]) -> tuple[torch.Tensor, torch.Tensor]:
    """The operator's packed images and (B, 7) parameter table, built here independently of letterbox()."""
    packed = torch.cat([torch.from_numpy(np.ascontiguousarray(image)).reshape(-1) for image in images])
    offsets = np.cumsum([0] + [image.size for image in images[:-1]])
    params = [
        [offset, *geometry.orig_shape, *geometry.resized_shape, geometry.pad_top, geometry.pad_left]
        for offset, geometry in zip(offsets.tolist(), geometries)
    ]
    return packed, torch.tensor(params, dtype=torch.int64)


def test_geometry_matches_stock(generator):
    for _ in range(500):
        height, width = (int(v) for v in torch.randint(1, 3000, (2,), generator=generator))
        new_shape = int(torch.randint(32, 1300, (1,), generator=generator)) // 32 * 32
        auto, scaleup, center = (bool(v) for v in torch.randint(0, 2, (3,), generator=generator))
        params = LetterBox(new_shape, auto=auto, scaleup=scaleup, center=center).get_params(
            {"img": np.empty((height, width, 3), np.uint8)}
        )
        geometry = letterbox_geometry((height, width), new_shape, auto, scaleup, center)
        assert geometry.resized_shape == params["new_unpad"][::-1]
        assert (geometry.pad_top, geometry.pad_left) == (params["top"], params["left"])
        assert geometry.shape == (
            params["new_unpad"][1] + params["top"] + params["bottom"],
            params["new_unpad"][0] + params["left"] + params["right"],
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rect", [False, True])
def test_assets_match_predictor(dtype, rect):
    """The wheel's images through the predictor's own pre_transform (auto from rect) and preprocess."""
    for images in ([*asset_arrays()], [asset_arrays()[1]] * 2):
        predictor = SimpleNamespace(
            imgsz=[640, 640], args=SimpleNamespace(rect=rect), scale_fill=False,
            model=SimpleNamespace(format="pt", stride=32, fp16=dtype == torch.float16), device=torch.device("cpu"),
        )
        predictor.pre_transform = lambda batch, p=predictor: BasePredictor.pre_transform(p, batch)
        expected = BasePredictor.preprocess(predictor, list(images))
        same_shapes = len({image.shape for image in images}) == 1
        ours, _ = letterbox(images, 640, auto=rect and same_shapes, dtype=dtype, device="cpu")
        assert ours.dtype == expected.dtype
        assert torch.equal(ours, expected)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_random_images_bit_identical(generator, case, dtype):
    height, width, new_shape, auto, scaleup, center, stride = case
    images = random_images(generator, 2, height, width)
    expected = stock_input(images, new_shape, auto, scaleup, center, stride, dtype)
    ours, geometries = letterbox(images, new_shape, auto, scaleup, center, stride, dtype, "cpu")
    assert ours.shape == expected.shape
    assert torch.equal(ours, expected)
    assert geometries[0] == letterbox_geometry((height, width), new_shape, auto, scaleup, center, stride)


def test_random_sizes_bit_identical(generator):
    """Random sizes, one image each, including the extremes that the fixed cases miss."""
    for _ in range(12):
        height, width = (int(v) for v in torch.randint(1, 1500, (2,), generator=generator))
        images = random_images(generator, 1, height, width)
        assert torch.equal(letterbox(images, 640, device="cpu")[0], stock_input(images)), (height, width)


def test_bfloat16(generator):
    """bfloat16 has no stock counterpart: the stock uint8 canvas converted as preprocess converts to float16."""
    images = random_images(generator, 2, 333, 517)
    canvas = torch.from_numpy(np.stack([LetterBox(640)(image=image) for image in images]))
    expected = canvas.permute(0, 3, 1, 2).flip(1).to(torch.bfloat16).div_(255)
    assert torch.equal(letterbox(images, 640, dtype=torch.bfloat16, device="cpu")[0], expected)


def test_mixed_sizes_keep_order(generator):
    images = random_images(generator, 1, 300, 200) + random_images(generator, 1, 123, 457)
    images += random_images(generator, 1, 300, 200)
    ours, geometries = letterbox(images, 640, device="cpu")
    assert torch.equal(ours, stock_input(images))
    assert [g.orig_shape for g in geometries] == [(300, 200), (123, 457), (300, 200)]


def test_tensor_inputs(generator):
    images = random_images(generator, 3, 211, 389)
    expected = stock_input(images)
    batch = torch.from_numpy(np.stack(images))
    assert torch.equal(letterbox(batch, 640)[0], expected)
    assert torch.equal(letterbox(list(batch), 640)[0], expected)
    assert torch.equal(letterbox(batch[0], 640)[0], expected[:1])


@pytest.mark.parametrize("shape", [(90, 130), (90, 130, 1), (90, 130, 2), (90, 130, 4)], ids=str)
def test_gray_and_bgra_converted_as_stock_loader(generator, shape):
    image = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator).numpy()
    expected = stock_input([LoadPilAndNumpy._single_check(image)])
    assert torch.equal(letterbox(image, 640, device="cpu")[0], expected)


def test_uint16_scaled_as_stock_loader(generator):
    image = torch.randint(0, 65536, (50, 70, 3), dtype=torch.int32, generator=generator).numpy().astype(np.uint16)
    expected = stock_input([LoadPilAndNumpy._single_check(image)])
    assert torch.equal(letterbox(image, 640, device="cpu")[0], expected)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("piece_bytes", [None, 5000], ids=["default-pieces", "small-pieces"])
def test_mixed_sizes_one_batch_bit_identical(generator, monkeypatch, device, piece_bytes):
    """A batch of many sizes (one kernel launch) equals stock on each image, bit for bit; with small staging pieces
    too, so that pieces both cut images and span several."""
    if piece_bytes:
        monkeypatch.setattr(letterbox_module, "_PIECE_BYTES", piece_bytes)
    images = mixed_images(generator)
    ours, geometries = letterbox(images, 640, dtype=torch.float16, device=device)
    assert ours.shape == (len(images), 3, 640, 640)
    for index, image in enumerate(images):
        expected = stock_input([LoadPilAndNumpy._single_check(image)], dtype=torch.float16, device=device)
        assert torch.equal(ours[index : index + 1], expected), (index, image.shape)
        assert geometries[index] == letterbox_geometry(image.shape, 640)
    if device == "cuda":  # the same images as tensors already on the GPU: packed there
        checked = [np.ascontiguousarray(LoadPilAndNumpy._single_check(image)) for image in images]
        on_gpu = [torch.from_numpy(image).to(device) for image in checked]
        assert torch.equal(letterbox(on_gpu, 640, dtype=torch.float16)[0], ours)


@pytest.mark.parametrize("device", devices())
def test_one_piece_batch_bit_identical(generator, device):
    """A batch that fits one staging piece (copied by pack_images, numpy's copy for what torch cannot wrap): a
    contiguous, a mirrored (negative strides), a read-only and a BGRA image equal stock's, bit for bit."""
    contiguous, mirrored, read_only = random_images(generator, 3, 123, 77)
    read_only.flags.writeable = False
    bgra = random_images(generator, 1, 45, 301, channels=4)[0]
    images = [contiguous, mirrored[::-1, ::-1], read_only, bgra]
    ours, _ = letterbox(images, 320, dtype=torch.float16, device=device)
    for index, image in enumerate(images):
        expected = stock_input([LoadPilAndNumpy._single_check(image)], 320, dtype=torch.float16, device=device)
        assert torch.equal(ours[index : index + 1], expected), index


@pytest.mark.parametrize("device", devices())
def test_out_written_in_place(generator, device):
    images = random_images(generator, 2, 211, 389) + random_images(generator, 1, 50, 1001)
    expected, _ = letterbox(images, 640, dtype=torch.float16, device=device)
    out = torch.full((3, 3, 640, 640), -1.0, dtype=torch.float16, device=device)
    result, geometries = letterbox(images, 640, dtype=torch.float16, out=out)  # the device is out's
    assert result is out
    assert torch.equal(out, expected)
    assert [g.orig_shape for g in geometries] == [(211, 389), (211, 389), (50, 1001)]


def test_bad_out():
    images = [np.zeros((10, 20, 3), np.uint8)] * 2
    for out in (
        torch.empty(1, 3, 640, 640),  # batch
        torch.empty(2, 3, 640, 320),  # canvas
        torch.empty(2, 3, 640, 640, dtype=torch.float16),  # dtype
        torch.empty(2, 640, 640, 3).permute(0, 3, 1, 2),  # not contiguous
        torch.empty(2, 3, 640, 640, device="meta"),  # device
        np.empty((2, 3, 640, 640), np.float32),
    ):
        with pytest.raises(ValueError, match="out must be"):
            letterbox(images, 640, device="cpu", out=out)


def test_bad_inputs():
    with pytest.raises(TypeError, match="uint8"):
        letterbox(torch.zeros(10, 10, 3), 640)
    with pytest.raises(TypeError, match="uint8"):
        letterbox(np.zeros((10, 10, 3), np.float32), 640)
    with pytest.raises(ValueError, match="channels"):
        letterbox(np.zeros((10, 10, 5), np.uint8), 640)
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        letterbox(torch.zeros(10, 10, 4, dtype=torch.uint8), 640)
    with pytest.raises(ValueError, match="no images"):
        letterbox([], 640)
    with pytest.raises(ValueError, match="one size"):
        letterbox([np.zeros((10, 20, 3), np.uint8), np.zeros((20, 10, 3), np.uint8)], 640, auto=True)
    image = np.zeros((10, 20, 3), np.uint8)
    for new_shape in (-64, 0, 10**6, 1e6, 640.0, (640,), (640, 0), (640, 480, 3), True, "640"):
        with pytest.raises(ValueError, match="new_shape"):
            letterbox(image, new_shape)
    for stride in (0, -32, 2.5, None):
        with pytest.raises(ValueError, match="stride"):
            letterbox(image, 640, auto=True, stride=stride)
    with pytest.raises(TypeError, match="dtype"):
        letterbox(image, 640, dtype=torch.int32)


def valid_op_arguments() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two images, 8x8 and 4x6, packed; each resized to 8x8 at the top left of an 8x8 canvas."""
    params = torch.tensor([[0, 8, 8, 8, 8, 0, 0], [192, 4, 6, 8, 8, 0, 0]])
    return torch.zeros(192 + 72, dtype=torch.uint8), params, torch.zeros(256), torch.empty(2, 3, 8, 8)


def with_param(params: torch.Tensor, row: int, column: int, value: int) -> torch.Tensor:
    changed = params.clone()
    changed[row, column] = value
    return changed


def test_op_argument_errors():
    op = torch.ops.yolo_fastdetect.letterbox
    images, params, table, out = valid_op_arguments()
    op(images, params, table, out)
    for arguments, error, message in [
        ((images.view(2, -1), params, table, out), ValueError, "images must be 1-D"),
        ((images.float(), params, table, out), TypeError, "images must be uint8"),
        ((images, params[:, :6], table, out), ValueError, r"image_params must be \(B, 7\)"),
        ((images, params.int(), table, out), TypeError, "image_params must be int64"),
        ((images, params, table[:10], out), ValueError, "value_table must hold 256"),
        ((images, params, table.long(), out), TypeError, "value_table must be"),
        ((images, params, table, out[:1]), ValueError, r"out must be \(B, 3, height, width\) with B = 2"),
        ((images, params, table, out.half()), TypeError, "out must have value_table's dtype"),
        ((images, params, table, out.transpose(2, 3)), ValueError, "out must be contiguous"),
        ((images, with_param(params, 1, 1, 0), table, out), ValueError, "row 1: the image must be at least 1x1"),
        ((images, with_param(params, 1, 0, -1), table, out), ValueError, "row 1: .* does not lie inside images"),
        ((images, with_param(params, 1, 0, 193), table, out), ValueError, "does not lie inside images"),
        ((images, with_param(params, 0, 1, 2**62), table, out), ValueError, "does not lie inside images"),
        ((images, with_param(params, 0, 2, 2**62), table, out), ValueError, "does not lie inside images"),
        ((images, with_param(params, 0, 3, 0), table, out), ValueError, "resized size must be positive"),
        ((images, with_param(params, 0, 6, -1), table, out), ValueError, "pad_top and pad_left must be >= 0"),
        ((images, with_param(params, 0, 5, 1), table, out), ValueError, "does not fit the canvas"),
        ((images, with_param(params, 0, 4, 2**62), table, out), ValueError, "does not fit the canvas"),
    ]:
        with pytest.raises(error, match=message):
            op(*arguments)


def test_empty_batch_and_opcheck(generator):
    op = torch.ops.yolo_fastdetect.letterbox
    table = torch.arange(256, dtype=torch.float32)
    empty = torch.empty(0, 3, 32, 32)
    op(torch.zeros(0, dtype=torch.uint8), torch.zeros(0, 7, dtype=torch.int64), table, empty)
    images = random_images(generator, 2, 5, 7) + random_images(generator, 1, 9, 3)
    geometries = [letterbox_geometry(image.shape, 32) for image in images]
    packed, params = op_inputs(images, geometries)
    torch.library.opcheck(op.default, (packed, params, table, torch.empty(3, 3, 32, 32)))


def test_pack_images_copies_each_image_to_its_offset(generator):
    """The staging operator against a byte-by-byte reference: images of several sizes (one above the per-thread
    grain, so several threads copy it), at offsets with gaps between them, leave the gaps untouched."""
    sizes = [3, 1, 700_001, 2_500_000, 17]
    images = [torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator) for size in sizes]
    gaps = torch.randint(0, 50, (len(sizes),), generator=generator).tolist()
    offsets, end = [], 0
    for size, gap in zip(sizes, gaps):
        offsets.append(end + gap)
        end += gap + size
    packed = torch.full((end + 5,), 7, dtype=torch.uint8)
    expected = packed.clone()
    for image, offset in zip(images, offsets):
        expected[offset : offset + image.numel()] = image
    torch.ops.yolo_fastdetect.pack_images(packed, images, offsets)
    assert torch.equal(packed, expected)
    torch.library.opcheck(torch.ops.yolo_fastdetect.pack_images.default, (packed, images[:2], offsets[:2]))


def test_pack_images_rejects_what_does_not_fit():
    op = torch.ops.yolo_fastdetect.pack_images
    image = torch.ones(10, dtype=torch.uint8)
    for packed, images, offsets, match in (
        (torch.zeros(15, dtype=torch.uint8), [image], [6], "does not fit"),
        (torch.zeros(15, dtype=torch.uint8), [image], [-1], "does not fit"),
        (torch.zeros(15, dtype=torch.uint8), [image], [0, 1], "one length"),
        (torch.zeros(15, dtype=torch.uint8), [torch.ones(20, dtype=torch.uint8)[::2]], [0], r"images\[0\]"),
        (torch.zeros(15, dtype=torch.float32), [image], [0], "packed"),
    ):
        with pytest.raises(ValueError, match=match):
            op(packed, images, offsets)


def random_boxes(generator, geometries, count, device):
    """(B, count, 6) boxes spread over (and past) each canvas, plus a score and a class column."""
    height, width = geometries[0].shape
    corners = torch.rand(len(geometries), count, 2, 2, generator=generator) * torch.tensor([width, height]) * 1.2 - 20
    corners = torch.sort(corners, dim=2).values  # x1 <= x2, y1 <= y2
    extras = torch.rand(len(geometries), count, 2, generator=generator)
    return torch.cat((corners.flatten(2), extras), 2).to(device)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("xywh", [False, True])
def test_scale_boxes_batch_matches_stock(generator, device, center, xywh):
    shapes = [(1080, 810), (720, 1280), (37, 1999), (640, 640)]
    geometries = [letterbox_geometry(shape, 640, center=center) for shape in shapes]
    boxes = random_boxes(generator, geometries, 50, device)
    scaled = scale_boxes_batch(boxes, geometries, xywh=xywh)
    for index, geometry in enumerate(geometries):
        # The predictor passes no ratio_pad (its padding is centred); a top-left padding needs it.
        ratio_pad = None if center else geometry.ratio_pad
        expected = stock_ops.scale_boxes(
            geometry.shape, boxes[index, :, :4].clone(), geometry.orig_shape, ratio_pad=ratio_pad, xywh=xywh
        )
        # At most one float32 rounding apart (on CUDA, PyTorch's division by a scalar gain multiplies by its
        # reciprocal): 2.4e-7 relative, 1.2e-4 px at 1000-2000 px.
        torch.testing.assert_close(scaled[index, :, :4], expected, rtol=2.4e-7, atol=1e-4)
    assert torch.equal(scaled[..., 4:], boxes[..., 4:])


def test_scale_boxes_batch_bad_inputs():
    geometry = LetterboxGeometry((10, 10), (10, 10), (32, 32), 11, 11)
    with pytest.raises(ValueError, match="boxes must be"):
        scale_boxes_batch(torch.zeros(1, 5, 3), [geometry])
    with pytest.raises(ValueError, match="geometries"):
        scale_boxes_batch(torch.zeros(2, 5, 6), [geometry])


# CUDA ------------------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
def test_cuda_matches_cpu_bytes(generator, case):
    """The resized bytes: the CUDA kernel against the CPU kernel, through an identity value table, for a batch of
    the case's size, a smaller and a larger image, on the case's canvas."""
    height, width, new_shape, auto, scaleup, center, stride = case
    images = random_images(generator, 2, height, width)
    geometries = [letterbox_geometry(image.shape, new_shape, auto, scaleup, center, stride) for image in images]
    if not auto:  # with auto the canvas depends on the size
        images += random_images(generator, 1, 7, 9) + random_images(generator, 1, 2 * height, width + 3)
        geometries += [letterbox_geometry(image.shape, new_shape, False, scaleup, center) for image in images[2:]]
    packed, params = op_inputs(images, geometries)
    table = torch.arange(256, dtype=torch.float32)
    on_cpu = torch.empty(len(images), 3, *geometries[0].shape)
    torch.ops.yolo_fastdetect.letterbox(packed, params, table, on_cpu)
    on_gpu = torch.full_like(on_cpu, -1.0, device="cuda")
    torch.ops.yolo_fastdetect.letterbox(packed.cuda(), params, table.cuda(), on_gpu)
    assert torch.equal(on_gpu.cpu(), on_cpu)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_matches_stock_cuda_preprocess(generator, dtype):
    """numpy images uploaded and letterboxed on the GPU against stock preprocess on the GPU (whose division runs
    there), for the wheel's images and random sizes; also as GPU tensors, one by one and as one batch."""
    batches = [asset_arrays(), random_images(generator, 4, 1037, 1999), random_images(generator, 2, 3, 5)]
    for images in batches:
        expected = stock_input(images, dtype=dtype, device="cuda")
        ours, _ = letterbox(images, 640, dtype=dtype, device="cuda")
        assert torch.equal(ours, expected)
        assert torch.equal(letterbox([torch.from_numpy(i).cuda() for i in images], 640, dtype=dtype)[0], expected)
        if len({image.shape for image in images}) == 1:
            batch = torch.from_numpy(np.stack(images)).cuda()
            assert torch.equal(letterbox(batch, 640, dtype=dtype)[0], expected)


@pytest.mark.cuda
def test_cuda_op_argument_errors():
    """The CUDA launcher checks as the CPU one does; the parameter table stays on the host."""
    images, params, table, out = (tensor.cuda() for tensor in valid_op_arguments())
    op = torch.ops.yolo_fastdetect.letterbox
    with pytest.raises(RuntimeError, match="image_params must be a CPU tensor"):
        op(images, params, table, out)
    with pytest.raises(ValueError, match="does not lie inside images"):
        op(images, with_param(params.cpu(), 1, 0, 193), table, out)
    with pytest.raises(RuntimeError, match="must be on one device"):
        op(images, params.cpu(), table.cpu(), out)
