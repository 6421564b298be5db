"""Letterbox preprocessing in one kernel per batch: ``yolo_fastdetect::letterbox`` (CPU and CUDA).

Stock Ultralytics letterboxes each image on the CPU (``LetterBox``: ``cv2.resize`` INTER_LINEAR, then
``cv2.copyMakeBorder`` with 114), stacks them, uploads the uint8 batch and converts it on the device (BGR -> RGB,
HWC -> CHW, ``.half()``/``.float()``, ``/ 255``). :func:`letterbox` uploads the original images once and does all of
it in one kernel launch per batch (images of any sizes), with cv2's 8-bit fixed-point arithmetic, so the model input
is bit-identical to stock's.
:func:`scale_boxes_batch` maps detections back to the original images, as ``ultralytics.utils.ops.scale_boxes``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from .._ext import on_load, require

__all__ = ["LetterboxGeometry", "letterbox", "letterbox_geometry", "scale_boxes_batch"]

PADDING_VALUE = 114


@dataclass(frozen=True)
class LetterboxGeometry:
    """Where one image lands in the model input: LetterBox's parameters for it.

    Attributes:
        orig_shape (tuple[int, int]): ``(height, width)`` of the original image.
        resized_shape (tuple[int, int]): ``(height, width)`` after the resize (LetterBox's ``new_unpad``, reversed).
        shape (tuple[int, int]): ``(height, width)`` of the padded canvas, the model input.
        pad_top (int): Padding rows above the resized image.
        pad_left (int): Padding columns left of it.
    """

    orig_shape: tuple[int, int]
    resized_shape: tuple[int, int]
    shape: tuple[int, int]
    pad_top: int
    pad_left: int

    @property
    def ratio_pad(self) -> tuple[tuple[float, float], tuple[int, int]]:
        """``((gain_y, gain_x), (pad_x, pad_y))`` as ``scale_boxes(..., ratio_pad=)`` takes it.

        The gains are the per-axis ratios of the rounded resized size, which is what stock ``scale_boxes`` computes
        when the predictor calls it without ``ratio_pad``.
        """
        gain_y = self.resized_shape[0] / self.orig_shape[0]
        gain_x = self.resized_shape[1] / self.orig_shape[1]
        return (gain_y, gain_x), (self.pad_left, self.pad_top)


MAX_SIDE = 1 << 15  # a canvas side in pixels; new_shape=1e6 asked torch for a 12 TB input


def _checked_new_shape(new_shape) -> tuple[int, int]:
    """``new_shape`` as ``(height, width)``; ValueError naming it unless each side is an int in [1, MAX_SIDE]."""
    sides = (new_shape, new_shape) if not isinstance(new_shape, (tuple, list)) else tuple(new_shape)
    if len(sides) != 2 or not all(
        isinstance(side, (int, np.integer)) and not isinstance(side, bool) and 1 <= side <= MAX_SIDE for side in sides
    ):
        raise ValueError(f"letterbox: new_shape must be an int or (height, width) of ints in [1, {MAX_SIDE}], "
                         f"got {new_shape!r}")
    return int(sides[0]), int(sides[1])


def letterbox_geometry(
    image_shape: Sequence[int],
    new_shape: int | Sequence[int] = 640,
    auto: bool = False,
    scaleup: bool = True,
    center: bool = True,
    stride: int = 32,
) -> LetterboxGeometry:
    """LetterBox's geometry for one image of ``image_shape`` ``(height, width, ...)``, step for step as
    ``ultralytics.data.augment.LetterBox.get_params`` (8.4) computes it, rounding included.

    Raises:
        ValueError: ``new_shape`` is not an int or two ints in [1, 32768], or ``stride`` is not an int >= 1.

    Examples:
        >>> letterbox_geometry((1080, 810), 640, auto=True).shape
        (640, 480)
    """
    shape = (int(image_shape[0]), int(image_shape[1]))
    new_shape = _checked_new_shape(new_shape)
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
        raise ValueError(f"letterbox: stride must be an int >= 1, got {stride!r}")
    ratio = min(new_shape[0] / shape[0], new_shape[1] / shape[1])
    if not scaleup:  # only scale down
        ratio = min(ratio, 1.0)
    resized_width, resized_height = max(round(shape[1] * ratio), 1), max(round(shape[0] * ratio), 1)
    pad_width, pad_height = new_shape[1] - resized_width, new_shape[0] - resized_height
    if auto:  # minimum rectangle: pad only up to the next multiple of the stride
        pad_width, pad_height = pad_width % stride, pad_height % stride
    if center:
        pad_width /= 2
        pad_height /= 2
    # The -0.1 / +0.1 puts the odd pixel of a centred padding at the bottom and right, as LetterBox does.
    top, bottom = round(pad_height - 0.1) if center else 0, round(pad_height + 0.1)
    left, right = round(pad_width - 0.1) if center else 0, round(pad_width + 0.1)
    return LetterboxGeometry(
        orig_shape=shape,
        resized_shape=(resized_height, resized_width),
        shape=(resized_height + top + bottom, resized_width + left + right),
        pad_top=top,
        pad_left=left,
    )


def _as_bgr(image: np.ndarray) -> np.ndarray:
    """A uint8 (H, W, 3) BGR view or copy of a numpy image, converted as Ultralytics' image loader does for a
    3-channel model: 16-bit scaled to 8, grayscale (and gray + alpha) repeated, BGRA without its alpha."""
    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
    if image.dtype != np.uint8:
        raise TypeError(f"letterbox: numpy images must be uint8 (or uint16), got {image.dtype}")
    image = np.atleast_3d(image)
    if image.ndim != 3 or not all(image.shape):
        raise ValueError(f"letterbox: expected an (H, W, C) image, got shape {image.shape}")
    channels = image.shape[2]
    if channels in (1, 2):  # gray, gray + alpha
        return np.repeat(image[..., :1], 3, axis=2)
    if channels == 4:  # BGRA
        return image[..., :3]
    if channels != 3:
        raise ValueError(f"letterbox: images must have 1 to 4 channels, got {channels}")
    return image


def _as_image_list(images) -> list[np.ndarray | torch.Tensor]:
    """The inputs as a list of (H, W, 3) uint8 BGR images (numpy arrays or tensors)."""
    if isinstance(images, torch.Tensor):
        if images.dim() == 3:
            images = [images]
        elif images.dim() == 4:
            images = list(images.unbind(0))
        else:
            raise ValueError(f"letterbox: a tensor must be (H, W, 3) or (B, H, W, 3), got {tuple(images.shape)}")
    elif isinstance(images, np.ndarray):
        images = [images]
    images = list(images)
    if not images:
        raise ValueError("letterbox: no images given")
    checked = []
    for image in images:
        if isinstance(image, np.ndarray):
            checked.append(_as_bgr(image))
        elif isinstance(image, torch.Tensor):
            if image.dtype != torch.uint8:
                raise TypeError(f"letterbox: image tensors must be uint8, got {image.dtype}")
            if image.dim() != 3 or image.shape[2] != 3:
                raise ValueError(f"letterbox: image tensors must be (H, W, 3) BGR, got {tuple(image.shape)}")
            checked.append(image)
        else:
            raise TypeError(f"letterbox: images must be numpy arrays or uint8 tensors, got {type(image).__name__}")
    return checked


_value_tables: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _value_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """u / 255 for every byte u, computed as stock preprocess computes it on that device (``.half()`` or
    ``.float()``, then ``.div_(255)``), so that the kernel's lookup gives the same bits."""
    key = (dtype, device)
    if key not in _value_tables:
        _value_tables[key] = torch.arange(256, dtype=torch.uint8, device=device).to(dtype).div_(255)
    return _value_tables[key]


# Host staging: numpy images are copied into one pinned buffer, in pieces of about _PIECE_BYTES, and each piece is sent
# to the GPU as soon as it is filled, so the host copies and the PCIe transfer overlap. Measured (the letterbox
# operator end to end, see benchmarks/RESULTS.md, Letterbox preprocessing):
# - one piece (batch 1 of an image up to 4 MB): the pack_images operator on this thread, over at most four threads
#   (csrc/letterbox/pack_images_cpu.cpp), about twice as fast as the pool below, whose one thread copies it with
#   numpy;
# - several pieces: the pool fills them at once, numpy's copy releasing the GIL, faster than pack_images filling
#   them one after the other.
_PIECE_BYTES = 4 << 20
_STAGING_THREADS = min(8, os.cpu_count() or 1)
_staging_pool: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """The staging threads, started on first use."""
    global _staging_pool
    if _staging_pool is None:
        _staging_pool = ThreadPoolExecutor(_STAGING_THREADS, thread_name_prefix="yolo_fastdetect_letterbox")
    return _staging_pool


def _pieces(arrays: Sequence[np.ndarray], offsets: Sequence[int]) -> list[list[tuple[np.ndarray, int]]]:
    """The packed buffer cut into consecutive pieces of about ``_PIECE_BYTES``: each a list of (rows of one image,
    their byte offset). Small images share a piece; a large one is cut by rows (any strides, e.g. a BGRA view)."""
    pieces, piece, piece_bytes = [], [], 0
    for array, offset in zip(arrays, offsets):
        row_bytes = array.shape[1] * 3
        rows_per_piece = max(1, _PIECE_BYTES // row_bytes)
        for row in range(0, array.shape[0], rows_per_piece):
            rows = array[row : row + rows_per_piece]
            piece.append((rows, offset + row * row_bytes))
            piece_bytes += rows.nbytes
            if piece_bytes >= _PIECE_BYTES:
                pieces.append(piece)
                piece, piece_bytes = [], 0
    if piece:
        pieces.append(piece)
    return pieces


def _fill(staging: torch.Tensor, piece: list[tuple[np.ndarray, int]]) -> tuple[int, int]:
    """Copy one piece into ``staging`` with numpy's copy (any strides); returns the byte range it filled."""
    buffer = staging.numpy()
    for rows, offset in piece:
        np.copyto(buffer[offset : offset + rows.nbytes].reshape(rows.shape), rows)
    last_rows, last_offset = piece[-1]
    return piece[0][1], last_offset + last_rows.nbytes


def _fill_threaded(staging: torch.Tensor, piece: list[tuple[np.ndarray, int]]) -> None:
    """Copy one piece into ``staging``: its contiguous rows with pack_images, the others with numpy's copy."""
    contiguous, offsets = [], []
    for rows, offset in piece:
        if rows.flags.c_contiguous and rows.flags.writeable:
            contiguous.append(torch.from_numpy(rows).view(-1))
            offsets.append(offset)
        else:  # a strided view (BGRA, mirrored) or read-only array: torch.from_numpy rejects or warns on those
            _fill(staging, [(rows, offset)])
    if contiguous:
        torch.ops.yolo_fastdetect.pack_images(staging, contiguous, offsets)


def _stage(arrays: Sequence[np.ndarray], offsets: Sequence[int], total: int, device: torch.device) -> torch.Tensor:
    """The numpy images packed at ``offsets`` in one flat uint8 tensor on ``device``: through pinned memory and a
    non-blocking copy per piece when the device is a GPU."""
    to_gpu = device.type == "cuda"
    # torch's caching host allocator reuses the pinned block only once the copies that read it have completed.
    staging = torch.empty(total, dtype=torch.uint8, pin_memory=to_gpu)
    packed = torch.empty(total, dtype=torch.uint8, device=device) if to_gpu else staging
    pieces = _pieces(arrays, offsets)
    if len(pieces) == 1:
        _fill_threaded(staging, pieces[0])
        filled = [(0, total)]
    else:
        futures = [_pool().submit(_fill, staging, piece) for piece in pieces]
        filled = (future.result() for future in as_completed(futures))  # each piece's range once it is filled
    for start, end in filled:  # also on the CPU: the loop is what waits for the pool's pieces
        if to_gpu:
            packed[start:end].copy_(staging[start:end], non_blocking=True)
    return packed


def _pack(
    images: np.ndarray | torch.Tensor | Sequence,
    image_list: Sequence[np.ndarray | torch.Tensor],
    offsets: Sequence[int],
    total: int,
    device: torch.device,
) -> torch.Tensor:
    """All images back to back, each (H, W, 3) row-major, in one flat uint8 tensor on ``device``. ``images`` is
    the caller's argument, ``image_list`` the checked images."""
    if isinstance(images, torch.Tensor) and images.device == device and images.is_contiguous():
        return images.reshape(-1)  # one (B, H, W, 3) batch, or one image, already in place
    if all(isinstance(image, torch.Tensor) and image.device.type != "cpu" for image in image_list):
        return torch.cat([image.to(device).reshape(-1) for image in image_list])  # already on a GPU: pack there
    arrays = [image if isinstance(image, np.ndarray) else image.cpu().numpy() for image in image_list]
    return _stage(arrays, offsets, total, device)


def _image_params(geometries: Sequence[LetterboxGeometry], offsets: Sequence[int], pin: bool) -> torch.Tensor:
    """The operator's (B, 7) int64 table: per image its byte offset, size, resized size and padding."""
    rows = [
        (offset, *geometry.orig_shape, *geometry.resized_shape, geometry.pad_top, geometry.pad_left)
        for geometry, offset in zip(geometries, offsets)
    ]
    params = torch.tensor(rows, dtype=torch.int64)
    return params.pin_memory() if pin else params  # pinned: the launcher's upload does not block the host


def _target_device(
    image_list: Sequence[np.ndarray | torch.Tensor], device: torch.device | str | None, out: torch.Tensor | None
) -> torch.device:
    """``device``, else ``out``'s, else the first tensor's, else CUDA when available; a GPU with its index."""
    if device is None:
        first = image_list[0]
        if out is not None:
            device = out.device
        elif isinstance(first, torch.Tensor):
            device = first.device
        else:
            device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _check_out(out: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """Raise ValueError unless ``out`` can take the result as it is."""
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"letterbox: out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape or out.dtype != dtype or out.device != device or not out.is_contiguous():
        layout = "" if out.is_contiguous() else " not contiguous"
        raise ValueError(
            f"letterbox: out must be a contiguous {shape} {dtype} tensor on {device}, got {tuple(out.shape)} "
            f"{out.dtype} on {out.device}{layout}"
        )


def letterbox(
    images: np.ndarray | torch.Tensor | Sequence[np.ndarray | torch.Tensor],
    new_shape: int | Sequence[int] = 640,
    auto: bool = False,
    scaleup: bool = True,
    center: bool = True,
    stride: int = 32,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[LetterboxGeometry]]:
    """The model input tensor of a batch of BGR images, as stock ``LetterBox`` + ``BasePredictor.preprocess``.

    Args:
        images: uint8 BGR images ``(H, W, C)``: numpy arrays (grayscale, gray + alpha and BGRA are converted as
            Ultralytics' loader converts them), uint8 ``(H, W, 3)`` tensors, a list of either, or one
            ``(B, H, W, 3)`` tensor.
        new_shape (int | tuple[int, int]): Target ``(height, width)`` (the predictor's ``imgsz``).
        auto (bool): Pad only to the next multiple of ``stride`` (the predictor sets it for PyTorch models with
            ``rect`` when all images have one size). Every image must end up on the same canvas size.
        scaleup (bool): Allow enlarging images (else only shrink).
        center (bool): Centre the image on the canvas (else top-left).
        stride (int): Model stride, for ``auto``.
        dtype (torch.dtype): float32 (stock without ``half``), float16 (``half=True``) or bfloat16.
        device: Where to build the input; defaults to ``out``'s device, else the tensors' device, else CUDA when
            available.
        out (torch.Tensor | None): A contiguous ``(B, 3, height, width)`` tensor of ``dtype`` on ``device`` to write
            the result into (e.g. a CUDA graph's static input); a new tensor when None.

    Returns:
        (torch.Tensor, list[LetterboxGeometry]): ``(B, 3, height, width)`` RGB in ``[0, 1]`` (``out`` when given)
        and, per image, the geometry that :func:`scale_boxes_batch` takes to map boxes back. ``dtype`` alone sets the
        output's dtype, under ``torch.autocast`` too.

    Examples:
        >>> images = [np.full((1080, 810, 3), 127, np.uint8), np.zeros((720, 1280, 3), np.uint8)]  # BGR, as cv2 reads
        >>> batch, geometries = letterbox(images, 640, device="cpu")
        >>> batch.shape, geometries[0].resized_shape, geometries[0].pad_left
        (torch.Size([2, 3, 640, 640]), (640, 480), 80)
    """
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"letterbox: dtype must be torch.float32, float16 or bfloat16, got {dtype}")
    image_list = _as_image_list(images)
    device = _target_device(image_list, device, out)
    require()
    geometries = [letterbox_geometry(image.shape, new_shape, auto, scaleup, center, stride) for image in image_list]
    canvas = geometries[0].shape
    if any(geometry.shape != canvas for geometry in geometries):
        raise ValueError("letterbox: with auto=True all images must have one size (their canvases differ)")
    shape = (len(image_list), 3, *canvas)
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=device)
    else:
        _check_out(out, shape, dtype, device)

    # One kernel launch per batch, whatever the sizes of its images. Numpy images are uploaded once (packed into pinned
    # memory by a few threads, the transfer overlapping the packing); tensors already on the GPU stay there.
    sizes = [height * width * 3 for height, width in (geometry.orig_shape for geometry in geometries)]
    offsets = [0, *accumulate(sizes[:-1])]
    packed = _pack(images, image_list, offsets, sum(sizes), device)
    params = _image_params(geometries, offsets, pin=device.type == "cuda")
    torch.ops.yolo_fastdetect.letterbox(packed, params, _value_table(dtype, device), out)
    return out, geometries


def scale_boxes_batch(
    boxes: torch.Tensor, geometries: Sequence[LetterboxGeometry], xywh: bool = False
) -> torch.Tensor:
    """Map boxes from the model input back to each original image, on the boxes' device.

    Matches ``ultralytics.utils.ops.scale_boxes(img.shape[2:], boxes, orig_shape)`` as the predictor calls it
    (``ratio_pad=geometry.ratio_pad`` for a padding that is not centred): subtract the padding, divide by the
    per-axis gain, and for ``xyxy`` clip to the original image.

    Args:
        boxes (torch.Tensor): ``(B, N, C)`` with ``C >= 4``, the first four columns ``x1, y1, x2, y2`` (or
            ``x, y, w, h``), e.g. the fixed-size detections of :func:`batched_nms`; other columns are kept.
        geometries (Sequence[LetterboxGeometry]): One per batch image, from :func:`letterbox`.
        xywh (bool): Boxes are ``x, y, w, h`` (shifted and scaled, not clipped).

    Returns:
        (torch.Tensor): A new tensor like ``boxes`` with the first four columns in original-image pixels.
    """
    if boxes.dim() != 3 or boxes.shape[2] < 4:
        raise ValueError(f"scale_boxes_batch: boxes must be (B, N, >=4), got {tuple(boxes.shape)}")
    if len(geometries) != boxes.shape[0]:
        raise ValueError(f"scale_boxes_batch: {len(geometries)} geometries for a batch of {boxes.shape[0]}")
    per_image = [(g.ratio_pad, g.orig_shape) for g in geometries]
    # (B, 1, 2, 2): rows are the two corners (or xy and wh), columns x and y.
    options = {"dtype": boxes.dtype, "device": boxes.device}
    gain = torch.tensor([[gx, gy] for ((gy, gx), _), _ in per_image], **options).view(-1, 1, 1, 2)
    pad = torch.tensor([[px, py] for (_, (px, py)), _ in per_image], **options).view(-1, 1, 1, 2)
    corner_pads = torch.cat((pad, torch.zeros_like(pad) if xywh else pad), 2)
    coordinates = (boxes[..., :4].unflatten(-1, (2, 2)) - corner_pads) / gain
    if not xywh:
        limit = torch.tensor([[w, h] for _, (h, w) in per_image], **options).view(-1, 1, 1, 2)
        coordinates = torch.minimum(coordinates.clamp(min=0), limit)
    scaled = boxes.clone()
    scaled[..., :4] = coordinates.flatten(-2)
    return scaled


# Fake kernel -----------------------------------------------------------------------------------------------------


def _letterbox_fake(images, image_params, value_table, out):
    torch._check(images.dim() == 1, lambda: "images must be 1-D (the images packed back to back)")
    torch._check(image_params.dim() == 2 and image_params.shape[1] == 7, lambda: "image_params must be (B, 7)")
    torch._check(
        out.dim() == 4 and out.shape[0] == image_params.shape[0] and out.shape[1] == 3,
        lambda: "out must be (B, 3, height, width)",
    )


def _pack_images_fake(packed, images, offsets):
    torch._check(len(images) == len(offsets), lambda: "images and offsets must have one length")


@on_load
def _register() -> None:
    torch.library.register_fake("yolo_fastdetect::letterbox")(_letterbox_fake)
    torch.library.register_fake("yolo_fastdetect::pack_images")(_pack_images_fake)
