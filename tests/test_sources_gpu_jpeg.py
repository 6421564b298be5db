"""Opt-in GPU JPEG decoding (:mod:`yolo_fastdetect.sources.gpu_jpeg`, ``YOLO_FASTDETECT_GPU_JPEG=1``): which files go
to nvJPEG (CPU, in CI), and on a GPU ``model.predict`` on a folder with the option against stock: the same paths,
batches, log lines and counters; the CPU-decoded files' bytes equal, the GPU-decoded ones within nvJPEG's rounding;
every batch letterboxed from the GPU copies; a failing GPU call falls back to stock's decoding."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

# corpus, model and the autouse fixture (the patch re-enabled) are test_sources' own
from test_sources import assert_same_results, corpus, model, restore_patch, stock_and_ours  # noqa: F401
from test_sources_upload import taken  # noqa: F401
from yolo_fastdetect.sources import gpu_jpeg

GPU_DECODED = {"a_baseline.jpg", "c_444.jpg"}  # the corpus' baseline YCbCr JPEGs without EXIF rotation


def test_only_complete_baseline_upright_color_jpegs_go_to_the_gpu(corpus, tmp_path):
    chosen = {path.name for path in sorted(corpus.iterdir()) if gpu_jpeg.read_for_gpu(str(path)) is not None}
    assert chosen == GPU_DECODED  # not progressive, gray, CMYK, EXIF-rotated, PNG, broken, video
    data = np.fromfile(corpus / "a_baseline.jpg", np.uint8)
    assert gpu_jpeg.gpu_decodable(data) and not gpu_jpeg.gpu_decodable(data[: data.size // 2])  # truncated
    renamed = tmp_path / "a_baseline.png"  # a JPEG under another suffix: imread decides, as stock
    renamed.write_bytes(data.tobytes())
    assert gpu_jpeg.read_for_gpu(str(renamed)) is None and gpu_jpeg.read_for_gpu(str(tmp_path / "none.jpg")) is None


def assert_close_to_stock(stock: list, ours: list) -> float:
    """Same paths and shapes; CPU-decoded images equal, GPU-decoded ones close. Returns the largest pixel gap."""
    assert [r[0] for r in ours] == [r[0] for r in stock]
    largest = 0
    for (path, stock_image, _, _), (_, image, _, _) in zip(stock, ours):
        assert image.shape == stock_image.shape and image.dtype == stock_image.dtype, path
        gap = np.abs(image.astype(np.int16) - stock_image.astype(np.int16))
        if path.endswith(tuple(GPU_DECODED)):
            # nvJPEG's rounding: 1.05 levels on average, 36 at most on these small, sharp images on the H200 (0.24
            # on the benchmark's larger ones); a channel swap or a misplaced row would be tens of levels on average.
            assert gap.mean() < 2.0 and gap.max() <= 64, (path, gap.mean(), gap.max())
            largest = max(largest, int(gap.max()))
        else:
            assert not gap.any(), path
    return largest


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 4])
def test_folder_with_gpu_jpeg_decoding_matches_stock_but_for_nvjpeg_rounding(model, corpus, taken, monkeypatch,
                                                                             batch):
    monkeypatch.setenv("YOLO_FASTDETECT_GPU_JPEG", "1")
    stock, ours = stock_and_ours(model, str(corpus), batch=batch, device="cuda")
    print("largest pixel gap to stock's decode:", assert_close_to_stock(stock["results"], ours["results"]))
    # Batches: the same paths, shapes, counters and info prefixes; the detections logged after the prefix may differ.
    def without_detections(batches):
        return [(paths, shapes, [text.split(": ")[0] for text in info], counters)
                for paths, shapes, info, counters in batches]

    assert without_detections(ours["batches"]) == without_detections(stock["batches"])
    assert [line for line in ours["log"] if "ms" not in line] == [line for line in stock["log"] if "ms" not in line]
    assert len(taken) == len(ours["batches"])
    assert all(copies is not None for copies, (paths, _, _, _) in zip(taken, ours["batches"])
               if any(path.endswith(tuple(GPU_DECODED)) for path in paths))


@pytest.mark.cuda
def test_a_failing_gpu_decode_falls_back_to_stock_decoding(model, corpus, monkeypatch):
    import torchvision.io

    def failing(*args, **kwargs):
        raise RuntimeError("nvJPEG failed")

    monkeypatch.setattr(torchvision.io, "decode_jpeg", failing)
    monkeypatch.setenv("YOLO_FASTDETECT_GPU_JPEG", "1")
    stock, ours = stock_and_ours(model, str(corpus), batch=4, device="cuda")
    assert_same_results(stock["results"], ours["results"])
    assert ours["batches"] == stock["batches"] and ours["log"] == stock["log"]


@pytest.mark.cuda
def test_gpu_decode_gives_host_and_device_copies_of_one_image(corpus):
    jpegs = [gpu_jpeg.read_for_gpu(str(corpus / name)) for name in sorted(GPU_DECODED)]
    decoded = gpu_jpeg.decode_on_gpu(jpegs, torch.device("cuda", 0))
    for (host, device_copy), jpeg in zip(decoded, jpegs):
        assert host.dtype == np.uint8 and host.ndim == 3 and host.shape[2] == 3
        assert device_copy.is_cuda and torch.equal(device_copy.cpu(), torch.from_numpy(host))
        reference = cv2.imdecode(jpeg.data, cv2.IMREAD_COLOR)
        assert host.shape == reference.shape and np.abs(host.astype(int) - reference).mean() < 2.0
