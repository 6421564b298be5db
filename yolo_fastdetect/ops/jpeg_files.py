"""JPEG files decoded a batch at a time without the GIL: ``yolo_fastdetect::decode_jpeg_files`` (CPU).

Decoder threads in Python need the GIL between two files, which the predictor's thread holds for much of each batch
(on the H200 host 15 threads decode 896 img/s alone, 268 beside one thread running pure Python). The operator reads
and decodes a whole batch on threads of its own with torchvision's decoder (libjpeg-turbo, as OpenCV's) and gives,
per file, the bytes Ultralytics' ``imread`` gives (``cv2.imdecode``, ``IMREAD_COLOR``: BGR, EXIF orientation applied)
or None where it declines the file (see ``csrc/jpeg_files/jpeg_files.h``), which the caller then decodes with
``imread``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .._ext import require

__all__ = ["decode_jpeg_files"]


def _load_torchvision_image_ops() -> None:
    """Register torchvision's image operators (its decoder), which importing ``torchvision.io`` does."""
    import torchvision.io  # noqa: F401

    if not hasattr(torch.ops.image, "decode_jpeg"):
        raise RuntimeError("yolo_fastdetect: torchvision's image operators are not available")


def decode_jpeg_files(paths: Sequence[str], threads: int = 1, apply_exif_orientation: bool = True
                      ) -> list[np.ndarray | None]:
    """Read and decode ``paths`` on ``threads`` threads, the GIL released meanwhile.

    Args:
        paths (Sequence[str]): Files to decode.
        threads (int): Threads decoding them (at most one per file is used).
        apply_exif_orientation (bool): Turn the image as its EXIF orientation says, as ``cv2.imdecode`` with
            ``IMREAD_COLOR`` does; False: as with ``IMREAD_COLOR | IMREAD_IGNORE_ORIENTATION``.

    Returns:
        (list[np.ndarray | None]): Per path its ``(H, W, 3)`` uint8 BGR image, as ``imread(path)`` gives it, or None
            where the file is not a JPEG this decoder is known to give ``imread``'s bytes for (CMYK, 12-bit,
            arithmetic-coded, truncated, not a JPEG at all) or cannot be read.

    Raises:
        ValueError: ``threads`` is below 1.
        RuntimeError: The operators or torchvision's image operators are unavailable.

    Examples:
        >>> images = decode_jpeg_files(["bus.jpg", "zidane.jpg"], threads=2)
        >>> images[0].shape
        (1080, 810, 3)
    """
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    require()
    _load_torchvision_image_ops()
    decoded = torch.ops.yolo_fastdetect.decode_jpeg_files([str(path) for path in paths],
                                                          bool(apply_exif_orientation), int(threads))
    return [image.numpy() if image.numel() else None for image in decoded]
