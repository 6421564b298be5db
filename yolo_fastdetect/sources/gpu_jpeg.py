"""Opt-in GPU JPEG decoding for file sources (``YOLO_FASTDETECT_GPU_JPEG=1``): nvJPEG through torchvision.

At batch 16 and 64 the CPU decoders bound a folder's pipeline (``bench sources``). nvJPEG decodes a batch of
baseline JPEGs on the GPU, faster than the CPU threads even with the copy back to the host that ``Results`` need
(see benchmarks/RESULTS.md, File sources). Its IDCT and chroma upsampling differ from libjpeg-turbo's, so its pixels
are not stock's (up to tens of levels apart): the detections can differ, which is why it is opt-in.

The decoder threads still read every file and probe its header; a baseline YCbCr JPEG without EXIF rotation that
ends in its EOI marker comes back as its bytes (:class:`EncodedJpeg`), anything else (progressive, gray, CMYK,
EXIF-rotated, truncated, PNG, ...) is decoded on the thread by Ultralytics' ``imread`` as without the option. The
loader then decodes a batch's JPEGs in one call, keeps their BGR copies on the GPU for the patched ``preprocess``
(:class:`.upload.Uploads`) and hands the predictor host copies (pinned within a budget) as the original images.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import ExifTags, Image

from ..pinned import host_copy_buffer
from .jpeg_bytes import ends_in_eoi

GPU_JPEG_SUFFIXES = (".jpg", ".jpeg")


@dataclass(frozen=True)
class EncodedJpeg:
    """A file's bytes, for the GPU decoder (the loader keeps its path with the batch)."""

    data: np.ndarray


def gpu_decodable(data: np.ndarray) -> bool:
    """Whether nvJPEG is given ``data``: a complete baseline JPEG in YCbCr that needs no EXIF rotation (where
    ``imread`` would rotate, or decode a gray, CMYK or progressive file its own way, the CPU decodes it)."""
    if not ends_in_eoi(data):
        return False
    try:
        with Image.open(io.BytesIO(data.tobytes())) as image:
            return (image.format == "JPEG" and image.mode == "RGB" and not image.info.get("progressive")
                    and image.getexif().get(ExifTags.Base.Orientation, 1) == 1)
    except Exception:  # noqa: BLE001 - not an image Pillow reads: imread decides, as without the option
        return False


def read_for_gpu(path: str) -> EncodedJpeg | None:
    """``path``'s bytes as an :class:`EncodedJpeg` where :func:`gpu_decodable`, else None (decode it on the CPU)."""
    if not path.lower().endswith(GPU_JPEG_SUFFIXES):
        return None
    try:
        data = np.fromfile(path, np.uint8)
    except OSError:
        return None
    return EncodedJpeg(data) if gpu_decodable(data) else None


def decode_on_gpu(jpegs: list[EncodedJpeg], device: torch.device) -> list[tuple[np.ndarray, torch.Tensor]] | None:
    """Decode ``jpegs`` in one nvJPEG call: per file its BGR image in host memory (pinned within a budget) and its
    (H, W, 3) uint8 BGR copy on ``device``; None if the call fails (the caller decodes them on the CPU)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    # The hardware decoder has been seen to ignore stream order and write into buffers still in use (torchcodec
    # issue 1634): the device is synchronised around the call.
    torch.cuda.synchronize(device)
    try:
        decoded = decode_jpeg([torch.from_numpy(j.data) for j in jpegs], mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        return None
    torch.cuda.synchronize(device)
    images = []
    for rgb in decoded:
        bgr = rgb.flip(0).permute(1, 2, 0).contiguous()  # RGB (3, H, W) -> BGR (H, W, 3), as imread gives
        host = host_copy_buffer(tuple(bgr.shape))
        host.copy_(bgr, non_blocking=True)
        images.append((host, bgr))
    torch.cuda.current_stream(device).synchronize()
    return [(host.numpy(), bgr) for host, bgr in images]
