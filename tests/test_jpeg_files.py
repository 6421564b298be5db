"""``decode_jpeg_files`` (the GIL-free batch decoder of folder sources) against Ultralytics' ``imread``: the same
bytes for every JPEG it takes (encoder variants with fresh random content, every EXIF orientation, in order under
many threads), and None for every file it must leave to ``imread`` (CMYK, PNG, truncated, lossless-coded, broken,
empty, missing)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image
from ultralytics.utils.patches import imread

from sources_corpus import EXIF_ORIENTATION
from test_sources_decode import content, jpeg_variants
from yolo_fastdetect import _ext
from yolo_fastdetect.ops.jpeg_files import decode_jpeg_files
from yolo_fastdetect.sources.batch_decode import BatchDecoder

pytestmark = pytest.mark.skipif(not _ext.available(), reason="the operators are not built")


def assert_imread_bytes(paths, images) -> None:
    for path, image in zip(paths, images, strict=True):
        expected = imread(str(path))
        assert image is not None, f"{path.name} was declined"
        assert image.dtype == expected.dtype and image.shape == expected.shape, path.name
        assert np.array_equal(image, expected), f"{path.name}: {np.count_nonzero(image != expected)} bytes differ"


def test_variants_give_imread_bytes(tmp_path, generator):
    rng = np.random.default_rng(generator.initial_seed())
    paths = jpeg_variants(tmp_path, rng)
    assert_imread_bytes(paths, decode_jpeg_files(paths, threads=3))


def test_every_exif_orientation_gives_imread_bytes(tmp_path, generator):
    image = content(np.random.default_rng(generator.initial_seed()), 203, 117)
    paths = []
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = orientation
        paths.append(tmp_path / f"rotated_{orientation}.jpg")
        image.save(paths[-1], quality=90, exif=exif)
    images = decode_jpeg_files(paths, threads=2)
    assert {im.shape[:2] for im in images} == {(117, 203), (203, 117)}  # not vacuous: some are turned
    assert_imread_bytes(paths, images)


def test_order_is_kept_under_many_threads(tmp_path, generator):
    rng = np.random.default_rng(generator.initial_seed())
    variants = jpeg_variants(tmp_path, rng)[:9]
    order = torch.randint(len(variants), (40,), generator=generator).tolist()
    paths = [variants[i] for i in order]
    assert_imread_bytes(paths, decode_jpeg_files(paths, threads=16))


def test_files_left_to_imread_are_declined(tmp_path, generator):
    image = content(np.random.default_rng(generator.initial_seed()), 150, 90)
    image.save(baseline := tmp_path / "baseline.jpg", quality=90)
    data = baseline.read_bytes()
    frame = data.index(b"\xff\xc0")  # the baseline frame header; as SOF3 the same file claims lossless coding
    files = {
        "cmyk.jpg": lambda p: image.convert("CMYK").save(p, quality=90),  # Adobe colour transform
        "lossless.png": lambda p: image.save(p),
        "truncated.jpg": lambda p: p.write_bytes(data[: len(data) // 2]),  # no EOI: cv2 decodes it its own way
        "trailing.jpg": lambda p: p.write_bytes(data + b"\x00" * 7),
        "sof3.jpg": lambda p: p.write_bytes(data[:frame] + b"\xff\xc3" + data[frame + 2:]),
        "broken.jpg": lambda p: p.write_bytes(b"\xff\xd8 not a JPEG " + bytes(range(256)) + b"\xff\xd9"),
        "empty.jpg": lambda p: p.write_bytes(b""),
    }
    for name, write in files.items():
        write(tmp_path / name)
    paths = [tmp_path / name for name in files] + [tmp_path / "missing.jpg"]
    assert decode_jpeg_files([baseline, *paths], threads=4)[1:] == [None] * len(paths)


def test_threads_is_checked(tmp_path):
    with pytest.raises(ValueError, match="threads"):
        decode_jpeg_files([tmp_path / "a.jpg"], threads=0)
    assert decode_jpeg_files([], threads=4) == []


def test_batch_decoder_leaves_undecodable_names_to_the_loader(tmp_path, generator):
    """A file name with bytes that are not UTF-8 (``os.fsdecode`` gives surrogates) cannot pass to the operator: the
    loader's own decode takes it, and the other files of the batch still go to the operator."""
    image = content(np.random.default_rng(generator.initial_seed()), 64, 48)
    odd = os.fsdecode(bytes(tmp_path) + b"/odd_\xff.jpg")
    image.save(odd, quality=90)
    image.save(plain := str(tmp_path / "plain.jpg"), quality=90)
    handed = []
    decoder = BatchDecoder(lambda path: ("loader", imread(path)), lambda path: handed.append(path) or path,
                           lambda path, im: ("operator", im), True, threads=2, batch_threads=2)
    try:
        results = decoder([odd, plain])
    finally:
        decoder.close()
    assert [source for source, _ in results] == ["loader", "operator"]
    assert all(np.array_equal(im, imread(path)) for (_, im), path in zip(results, [odd, plain]))
