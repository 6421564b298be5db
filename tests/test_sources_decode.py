"""A list of paths decodes JPEGs through OpenCV only where that gives the bytes of stock's route (Pillow, EXIF
transpose, RGB -> BGR): checked here on a corpus of JPEG variants with fresh random content, and every other file
(CMYK, EXIF-rotated, PNG, truncated) must take Pillow's route."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image
from ultralytics.data.loaders import LoadPilAndNumpy, autocast_list

from sources_corpus import EXIF_ORIENTATION, asset
from yolo_fastdetect.sources.path_list import _decode, opencv_decodes

SIZES = ((317, 239), (640, 481), (33, 17), (1280, 720))  # (width, height): odd, partial MCUs, tiny, common


def stock_route(path: Path) -> np.ndarray:
    return LoadPilAndNumpy._single_check(autocast_list([str(path)])[0], 3)


def content(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A photo crop, a gradient and noise mixed, so that every DCT coefficient and the chroma edges are exercised."""
    photo = np.asarray(asset(int(rng.integers(2)), width, height), dtype=np.float32)
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    noise = rng.normal(0, 40, (height, width, 3)).astype(np.float32)
    return Image.fromarray(np.clip(0.6 * photo + 0.2 * ramp + noise, 0, 255).astype(np.uint8))


def jpeg_variants(folder: Path, rng: np.random.Generator) -> list[Path]:
    """JPEGs from Pillow's and OpenCV's encoders: qualities, 4:4:4 / 4:2:2 / 4:2:0 / 4:1:1, progressive, optimized
    Huffman tables, restart markers, grayscale."""
    paths = []
    for width, height in SIZES:
        image = content(rng, width, height)
        pil = {
            "q50_420": {"quality": 50},
            "q95_444": {"quality": 95, "subsampling": 0},
            "q90_422": {"quality": 90, "subsampling": 1},
            "q100_420": {"quality": 100, "subsampling": 2},
            "progressive": {"quality": 85, "progressive": True},
            "optimized": {"quality": 80, "optimize": True},
        }
        for name, options in pil.items():
            paths.append(folder / f"pil_{name}_{width}x{height}.jpg")
            image.save(paths[-1], **options)
        paths.append(folder / f"pil_gray_{width}x{height}.jpg")
        image.convert("L").save(paths[-1], quality=90)
        bgr = np.asarray(image)[..., ::-1]
        opencv = {
            "q75": [cv2.IMWRITE_JPEG_QUALITY, 75],
            "restarts": [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_RST_INTERVAL, 3],
            "411": [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411],
            "progressive": [cv2.IMWRITE_JPEG_PROGRESSIVE, 1],
        }
        for name, options in opencv.items():
            paths.append(folder / f"cv2_{name}_{width}x{height}.jpg")
            assert cv2.imwrite(str(paths[-1]), np.ascontiguousarray(bgr), options)
    return paths


def test_opencv_route_gives_stock_bytes(tmp_path, generator):
    rng = np.random.default_rng(generator.initial_seed())
    for path in jpeg_variants(tmp_path, rng):
        assert opencv_decodes(path), path.name
        name, image, _ = _decode((0, path, True), 3)
        expected = stock_route(path)
        assert name == str(path)
        assert image.dtype == expected.dtype and image.shape == expected.shape, path.name
        assert np.array_equal(image, expected), f"{path.name}: {np.count_nonzero(image != expected)} bytes differ"


def test_other_files_take_the_pillow_route(tmp_path, generator):
    rng = np.random.default_rng(generator.initial_seed())
    image = content(rng, 200, 120)
    others = {}
    for orientation in range(2, 9):
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = orientation
        others[f"rotated_{orientation}.jpg"] = lambda p, exif=exif: image.save(p, quality=90, exif=exif)
    others["cmyk.jpg"] = lambda p: image.convert("CMYK").save(p, quality=90)
    others["lossless.png"] = lambda p: image.save(p)
    others["paletted.png"] = lambda p: image.quantize(64).save(p)
    for name, write in others.items():
        path = tmp_path / name
        write(path)
        assert not opencv_decodes(path), name
        assert np.array_equal(_decode((0, path, False), 3)[1], stock_route(path)), name

    truncated = tmp_path / "truncated.jpg"
    data = (tmp_path / "rotated_2.jpg").read_bytes()
    image.save(truncated, quality=90)
    truncated.write_bytes(truncated.read_bytes()[: len(data) // 2])
    assert opencv_decodes(truncated)  # its header is a plain JPEG's; the missing end sends it to Pillow
    with pytest.raises(OSError) as stock_error:
        stock_route(truncated)
    with pytest.raises(OSError) as our_error:
        _decode((0, truncated, True), 3)
    assert str(our_error.value) == str(stock_error.value)
