"""Small image and video sources made from the wheel's images, for the source-loader tests: JPEG variants
(baseline, progressive, 4:4:4, grayscale, CMYK, EXIF-rotated), a PNG, an unreadable file and two short videos,
in sizes that are not square and not all alike."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from conftest import asset_images

EXIF_ORIENTATION = 0x0112


def asset(index: int, width: int, height: int) -> Image.Image:
    """bus.jpg (0) or zidane.jpg (1) resized to ``width`` x ``height``, RGB."""
    return Image.open(asset_images()[index]).convert("RGB").resize((width, height))


def write_images(folder: Path) -> list[Path]:
    """The image variants (and one unreadable file), sorted by name as a folder source lists them."""
    folder.mkdir(parents=True, exist_ok=True)
    rotated_exif = Image.Exif()
    rotated_exif[EXIF_ORIENTATION] = 6  # turned 90 degrees: exif_transpose makes it 240 wide, 320 high
    writers = {
        "a_baseline.jpg": lambda p: asset(0, 240, 320).save(p, quality=90),
        "b_progressive.jpg": lambda p: asset(1, 320, 192).save(p, quality=85, progressive=True),
        "c_444.jpg": lambda p: asset(0, 240, 320).save(p, quality=95, subsampling=0),
        "d_gray.jpg": lambda p: asset(1, 320, 192).convert("L").save(p, quality=90),
        "e_cmyk.jpg": lambda p: asset(0, 200, 288).convert("CMYK").save(p, quality=90),
        "f_rotated.jpg": lambda p: asset(1, 320, 240).save(p, quality=90, exif=rotated_exif),
        "g_lossless.png": lambda p: asset(0, 256, 200).save(p),
        "h_broken.jpg": lambda p: p.write_bytes(b"\xff\xd8 not a JPEG " + bytes(range(256))),
    }
    for name, write in writers.items():
        write(folder / name)
    return sorted(folder / name for name in writers)


def write_video(path: Path, frames: int, width: int, height: int) -> Path:
    """An mp4 (mp4v) whose frames pan across the two assets, so that consecutive frames differ."""
    strip = np.concatenate([np.asarray(asset(i, width, height))[..., ::-1] for i in (0, 1)], axis=1)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (width, height))
    for index in range(frames):
        shift = index * width // max(1, frames)
        writer.write(np.ascontiguousarray(strip[:, shift : shift + width]))
    writer.release()
    return path


def write_corpus(folder: Path) -> Path:
    """A folder with the image variants and two videos of 7 and 5 frames (sizes 256x192 and 192x256)."""
    write_images(folder)
    write_video(folder / "v1_clip.mp4", 7, 256, 192)
    write_video(folder / "v2_clip.mp4", 5, 192, 256)
    return folder
