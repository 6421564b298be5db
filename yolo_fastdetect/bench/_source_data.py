"""The files ``bench sources`` reads, made offline from the wheel's bus.jpg and zidane.jpg: JPEGs of several sizes
and qualities, each a different random crop (so no two files are alike), and mp4 clips that pan across the two
images (so that consecutive frames differ and the decoder has real work): mp4v, the encoder OpenCV's wheels carry,
or H.264 through PyAV (libx264, yuv420p, BT.709-tagged as HD cameras write it)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from ._camera_clips import BT709
from ._camera_clips import write_clip as write_h264
from ._tiny_dataset import random_crop, read_assets

SIZES = ((640, 480), (1280, 720), (1920, 1080), (3840, 2160))  # (width, height)
QUALITIES = (75, 90, 95)


def write_jpegs(folder: Path, count: int, sizes=SIZES, qualities=QUALITIES, seed: int = 0) -> list[Path]:
    """``count`` JPEGs cycling through ``sizes`` and ``qualities``: a random crop of an asset (at least half of it,
    flipped at random), resized. Returns their paths in name order."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    assets = read_assets()
    paths = []
    for index in range(count):
        crop = random_crop(assets[index % len(assets)], rng, 0.5)
        size = sizes[index % len(sizes)]
        path = folder / f"img_{index:05d}_{size[0]}x{size[1]}.jpg"
        quality = qualities[index // len(sizes) % len(qualities)]
        resized = cv2.resize(crop, size, interpolation=cv2.INTER_AREA)
        cv2.imwrite(str(path), resized, [cv2.IMWRITE_JPEG_QUALITY, quality])
        paths.append(path)
    return sorted(paths)


def _panning(frames: int, width: int, height: int) -> list[np.ndarray]:
    """``frames`` BGR frames panning across the two assets."""
    strip = np.concatenate([cv2.resize(image, (width, height)) for image in read_assets() * 2], axis=1)
    shifts = (index * (strip.shape[1] - width) // max(1, frames - 1) for index in range(frames))
    return [np.ascontiguousarray(strip[:, shift : shift + width]) for shift in shifts]


def write_clip(path: Path, frames: int, width: int, height: int, fps: float = 30.0, codec: str = "mp4v") -> Path:
    """An mp4 of ``frames`` frames panning across the two assets, ``codec`` "mp4v" (OpenCV's writer) or "h264"
    (PyAV's libx264: needs ``av``)."""
    if codec == "h264":
        return write_h264(path, _panning(frames, width, height), width, height, fps=round(fps), colorspace=BT709,
                          primaries=BT709, transfer=BT709)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*codec), fps, (width, height))
    for image in _panning(frames, width, height):
        writer.write(image)
    writer.release()
    return path
