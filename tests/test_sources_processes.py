"""Decoder processes (``YOLO_FASTDETECT_DECODE_PROCESSES``, opt-in): the bytes of Ultralytics' ``imread`` for every
kind of file, a folder and a list of paths predicted as stock predicts them, a truncated JPEG of a list sent to
Pillow (as stock, which raises), a killed worker's jobs done on threads, bad settings named."""

from __future__ import annotations

import os
import signal
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from ultralytics.data import loaders

from sources_corpus import write_corpus, write_images
from test_sources import assert_same_files, assert_same_results, detecting_model, list_sources, stock_and_ours
from yolo_fastdetect import sources
from yolo_fastdetect.sources import DecoderProcesses, FileLoader, PathListLoader, decoder_processes, files
from yolo_fastdetect.sources import path_list as path_list_module

FLAGS = {"color": cv2.IMREAD_COLOR, "gray": cv2.IMREAD_GRAYSCALE}


def decoder_pool(processes: int, flags: int) -> tuple[DecoderProcesses, partial]:
    decode = partial(files._decode, flags=flags, uploads=None)
    return DecoderProcesses(processes, decode, files.worker_file, flags), decode


def assert_same_image(image, expected, path) -> None:
    if expected is None:
        assert image is None, path
    else:
        assert image.dtype == expected.dtype and image.shape == expected.shape, path
        assert np.array_equal(image, expected), path


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> list[Path]:
    """The corpus' image variants (a broken file among them) and what the workers must decline or leave alone."""
    folder = tmp_path_factory.mktemp("variants")
    paths = write_images(folder)
    image = cv2.imread(str(paths[0]))
    cv2.imwrite(str(folder / "i_page.tif"), image)  # imread's TIFF branch: decoded here, never by a worker
    cv2.imwrite(str(folder / "j_deep.png"), image.astype(np.uint16) * 257)  # 16 bits: imread shifts them to 8
    (folder / "k_empty.jpg").write_bytes(b"")
    return [*paths, folder / "i_page.tif", folder / "j_deep.png", folder / "k_empty.jpg", folder / "l_missing.jpg"]


@pytest.fixture
def corpus_folder(tmp_path) -> Path:
    folder = tmp_path / "images"
    write_images(folder)
    return folder


@pytest.mark.parametrize("flags", FLAGS.values(), ids=FLAGS.keys())
def test_workers_decode_as_imread(variants, flags):
    pool, decode = decoder_pool(2, flags)
    with pool:
        futures = [pool.submit(decode, str(path)) for path in variants]
        for path, future in zip(variants, futures):
            assert_same_image(future.result(timeout=60), loaders.imread(str(path), flags=flags), path)


def test_workers_take_the_images_threads_do_not(variants, monkeypatch):
    """Not vacuous: the plain JPEGs and the PNG come back through shared memory, TIFF and failures do not."""
    mapped = []
    real_mapped = decoder_processes._mapped
    monkeypatch.setattr(decoder_processes, "_mapped", lambda fd, shape: mapped.append(shape) or real_mapped(fd, shape))
    pool, decode = decoder_pool(2, cv2.IMREAD_COLOR)
    with pool:
        for path in variants:
            pool.submit(decode, str(path)).result(timeout=60)
    decodable = [p for p in variants if p.suffix in (".jpg", ".png") and "broken" not in p.name and p.exists()]
    assert len(mapped) == len(decodable) - 1  # the empty file is declined (IMREAD_COLOR reads the 16-bit PNG as 8)


def test_a_killed_worker_hands_its_jobs_to_threads(variants, generator):
    readable = [str(p) for p in variants[:7]] * 6
    order = torch.randperm(len(readable), generator=generator).tolist()
    pool, decode = decoder_pool(2, cv2.IMREAD_COLOR)
    with pool:
        futures = [pool.submit(decode, readable[i]) for i in order]
        os.kill(pool._pool._workers[0].process.pid, signal.SIGKILL)
        futures += [pool.submit(decode, readable[i]) for i in order]
        for index, future in zip(order * 2, futures):
            assert_same_image(future.result(timeout=60), loaders.imread(readable[index]), readable[index])


def test_folder_with_processes_matches_stock(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus")
    monkeypatch.setenv(sources.PROCESSES_VARIABLE, "2")
    model = detecting_model("cpu", logit_scale=1e7)
    stock, ours = stock_and_ours(model, str(corpus), tmp_path, batch=4, device="cpu")
    assert ours["dataset"] is FileLoader
    assert_same_results(stock["results"], ours["results"])
    assert ours["batches"] == stock["batches"]
    assert ours["log"] == stock["log"]
    assert_same_files(stock["saved"], ours["saved"])


def test_list_with_processes_matches_stock(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus")
    monkeypatch.setenv(sources.PROCESSES_VARIABLE, "2")
    model = detecting_model("cpu", logit_scale=1e7)
    stock, ours = stock_and_ours(model, list_sources(corpus)["mixed sizes"], tmp_path, batch=3, device="cpu")
    assert ours["dataset"] is PathListLoader
    assert_same_results(stock["results"], ours["results"])
    assert ours["log"] == stock["log"]
    assert_same_files(stock["saved"], ours["saved"])


def test_a_truncated_jpeg_of_a_list_goes_to_pillow(corpus_folder):
    """Its header says plain JPEG, so it is sent to a worker, which declines it (no EOI): Pillow's route raises
    what stock raises."""
    whole = corpus_folder / "a_baseline.jpg"
    truncated = corpus_folder / "z_truncated.jpg"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(OSError, match="truncated"):
        list(PathListLoader([str(whole), str(truncated)], batch=2, processes=2))
    decode = partial(path_list_module._decode, channels=3)
    pool = DecoderProcesses(2, decode, path_list_module._worker_file, path_list_module._OPENCV_FLAGS,
                            partial(path_list_module._named, None), whole_jpeg=True)
    with pool:
        name, image = pool.submit(decode, (0, whole, True)).result(timeout=60)
    assert name == str(whole) and np.array_equal(image, path_list_module._decode((0, whole, True), 3)[1])


def test_processes_setting_is_validated(monkeypatch):
    monkeypatch.setenv(sources.PROCESSES_VARIABLE, "0")
    assert sources.decode_processes() == 0
    for value in ("-1", "two"):
        monkeypatch.setenv(sources.PROCESSES_VARIABLE, value)
        with pytest.raises(ValueError, match=sources.PROCESSES_VARIABLE):
            sources.decode_processes()


def test_workers_that_cannot_start_or_die_at_once_leave_threads(corpus_folder, monkeypatch):
    """No interpreter to start (a warning, then threads), or workers that exit at once (their jobs go to threads):
    the same images either way."""
    def loaded(processes: int) -> list:
        batches = FileLoader(str(corpus_folder), batch=3, processes=processes)
        return [image for _, images, _ in batches for image in images]

    expected = loaded(0)
    decoder_processes.stop_shared_pool()  # the pool of an earlier test would serve these loaders
    monkeypatch.setattr(decoder_processes, "_WORKER", corpus_folder / "no_such_worker.py")
    for image, stock in zip(loaded(2), expected, strict=True):
        assert np.array_equal(image, stock)
    decoder_processes.stop_shared_pool()
    monkeypatch.setattr(decoder_processes.sys, "executable", str(corpus_folder / "no_such_python"))
    for image, stock in zip(loaded(2), expected, strict=True):
        assert np.array_equal(image, stock)
    decoder_processes.stop_shared_pool()
