"""The parallel file-source loaders against stock Ultralytics: ``model.predict`` on the same folders, globs, lists
and videos with the package off and on, comparing what a user sees: each ``Results``' path, original image bytes
and boxes, every log line (the "Image Read Error" warning included), each batch's paths, ``info`` strings and the
loader's mode and frame counters, the files that ``save``, ``save_txt`` and ``save_crop`` write, and the errors for
paths that do not exist.

With the package on, the fused decode is also on, and its boxes differ from stock's by float rounding (up to ~1e-4
px here; the decode tests bound it): boxes and saved labels are compared within 1e-3 px, everything else exactly."""

from __future__ import annotations

import io
import logging
import os
import re
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from ultralytics.data.loaders import LoadImagesAndVideos, LoadPilAndNumpy

import yolo_fastdetect
from conftest import detecting_model, devices
from sources_corpus import write_corpus
from yolo_fastdetect import sources
from yolo_fastdetect.sources import FileLoader, PathListLoader

IMGSZ = 256  # small inputs keep the CPU runs short; the loaders do not depend on it


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def model():
    return detecting_model("cpu", logit_scale=1e7)  # scores without ties: stock and ours keep the same boxes


@pytest.fixture(autouse=True)
def restore_patch():
    yield
    yolo_fastdetect.enable()


@contextmanager
def captured_log():
    """Every message Ultralytics logs (INFO and up), one string per line."""
    from ultralytics.utils import LOGGER

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.extend(record.getMessage().split("\n"))
    level = LOGGER.level
    LOGGER.setLevel(logging.INFO)
    LOGGER.addHandler(handler)
    try:
        yield lines
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)


def without_times(text: str) -> str:
    return re.sub(r"\d+\.\dms", "#ms", text)


def observe(model, source, save_dir: Path | None = None, **kwargs) -> dict:
    """Run ``model.predict(source, stream=True, verbose=True)`` and record what a user can see of it."""
    batches = []

    def on_batch_end(predictor):
        paths, images, info = predictor.batch
        dataset = predictor.dataset
        counters = tuple(getattr(dataset, name, None) for name in ("mode", "frame", "frames", "fps", "count"))
        batches.append((list(paths), [image.shape for image in images], [without_times(s) for s in info], counters))

    if save_dir is not None:
        kwargs.update(save=True, save_txt=True, save_crop=True, project=str(save_dir.parent), name=save_dir.name)
    model.predictor = None  # a fresh predictor for each run and device
    model.add_callback("on_predict_batch_end", on_batch_end)
    try:
        with captured_log() as lines:
            results = [
                (r.path, r.orig_img.copy(), r.boxes.data.clone(), r.names)
                for r in model.predict(source, stream=True, verbose=True, imgsz=IMGSZ, **kwargs)
            ]
    finally:
        model.callbacks["on_predict_batch_end"].remove(on_batch_end)
    saved = {}
    if save_dir is not None:
        saved = {str(p.relative_to(save_dir)): p.read_bytes() for p in sorted(save_dir.rglob("*")) if p.is_file()}
        lines = [line.replace(str(save_dir), "<save_dir>") for line in lines]
    return {"results": results, "batches": batches, "log": [without_times(line) for line in lines], "saved": saved,
            "dataset": type(model.predictor.dataset)}


def stock_and_ours(model, source, tmp_path: Path | None = None, **kwargs) -> tuple[dict, dict]:
    yolo_fastdetect.disable()
    stock = observe(model, source, tmp_path and tmp_path / "stock", **kwargs)
    yolo_fastdetect.enable()
    ours = observe(model, source, tmp_path and tmp_path / "ours", **kwargs)
    return stock, ours


def assert_same_results(stock: list, ours: list) -> None:
    assert [r[0] for r in ours] == [r[0] for r in stock]  # paths
    for (path, stock_image, stock_boxes, stock_names), (_, image, boxes, names) in zip(stock, ours):
        assert image.dtype == stock_image.dtype and np.array_equal(image, stock_image), path
        assert names == stock_names
        assert boxes.shape == stock_boxes.shape and torch.equal(boxes[:, 5], stock_boxes[:, 5]), path
        torch.testing.assert_close(boxes, stock_boxes, atol=1e-3, rtol=1e-5)


def assert_same_files(stock: dict[str, bytes], ours: dict[str, bytes]) -> None:
    """The same files; labels with the same lines and numbers (within the boxes' rounding)."""
    assert ours.keys() == stock.keys()
    for name in (name for name in stock if name.endswith(".txt")):
        stock_rows, rows = (np.loadtxt(io.BytesIO(files[name]), ndmin=2) for files in (stock, ours))
        np.testing.assert_allclose(rows, stock_rows, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize(("batch", "vid_stride"), [(1, 1), (4, 2), (16, 1)])
def test_folder_with_videos_matches_stock(model, corpus, tmp_path, batch, vid_stride, device):
    """On CUDA stock's predictor also decodes one batch ahead on a thread of its own (``_prefetch``), handing the
    loop a copy of the loader per batch: the counters compared are those copies'."""
    stock, ours = stock_and_ours(model, str(corpus), tmp_path, batch=batch, vid_stride=vid_stride, device=device)
    assert stock["dataset"] is LoadImagesAndVideos and ours["dataset"] is FileLoader
    assert len(stock["results"]) == 7 + 7 // vid_stride + 5 // vid_stride  # the broken image is skipped
    assert_same_results(stock["results"], ours["results"])
    assert ours["batches"] == stock["batches"]
    assert any("Image Read Error" in line and "h_broken.jpg" in line for line in stock["log"])
    assert ours["log"] == stock["log"]
    assert any(name.endswith(".avi") for name in stock["saved"]) and any("crops" in n for n in stock["saved"])
    assert_same_files(stock["saved"], ours["saved"])


@pytest.mark.parametrize("kind", ["file", "path", "glob", "txt", "csv", "video"])
def test_file_source_kinds_match_stock(model, corpus, tmp_path, kind):
    images = sorted(p for p in corpus.glob("*.*") if p.suffix != ".mp4")
    if kind in ("txt", "csv"):
        manifest = tmp_path / f"list.{kind}"
        entries = [os.path.relpath(p, tmp_path) for p in reversed(images[:4])]  # relative to the manifest
        manifest.write_text(("source\n" if kind == "csv" else "") + "\n".join(entries) + "\n")
        source = str(manifest)
    else:
        source = {"file": str(images[1]), "path": images[5], "glob": str(corpus / "[a-d]*.jpg"),
                  "video": str(corpus / "v2_clip.mp4")}[kind]
    stock, ours = stock_and_ours(model, source, batch=2)
    assert ours["dataset"] is FileLoader
    assert_same_results(stock["results"], ours["results"])
    assert ours["batches"] == stock["batches"] and ours["log"] == stock["log"]


def list_sources(corpus: Path) -> dict[str, list]:
    readable = [p for p in sorted(corpus.glob("*.*")) if p.suffix != ".mp4" and "broken" not in p.name]
    return {
        "mixed sizes": [str(p) for p in reversed(readable)],
        # 240x320 all (f_rotated is stored 320x240 with EXIF orientation 6); the first two alone would also be one
        # size, so this list shows that batches of a list take its shape rule, not their own.
        "one size": [corpus / "a_baseline.jpg", corpus / "c_444.jpg", corpus / "f_rotated.jpg"],
        "one size, then another": [str(corpus / "a_baseline.jpg"), str(corpus / "c_444.jpg"),
                                   str(corpus / "b_progressive.jpg")],
    }


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("name", ["mixed sizes", "one size", "one size, then another"])
@pytest.mark.parametrize("batch", [1, 2, 32])
def test_list_of_paths_matches_stock(model, corpus, tmp_path, name, batch, device):
    source = list_sources(corpus)[name]
    stock, ours = stock_and_ours(model, tuple(source) if batch == 2 else source, tmp_path, batch=batch, device=device)
    assert stock["dataset"] is LoadPilAndNumpy and ours["dataset"] is PathListLoader
    assert_same_results(stock["results"], ours["results"])
    assert_same_files(stock["saved"], ours["saved"])
    # Stock logs its one batch in one message, ours a message per batch: the same lines, image by image.
    assert ours["log"] == stock["log"]


def test_missing_and_unreadable_paths_raise_as_stock(model, corpus, tmp_path):
    cases = {
        "missing folder": str(tmp_path / "nowhere"),
        "empty folder": str(tmp_path),
        "missing file in a list": [str(corpus / "a_baseline.jpg"), str(tmp_path / "missing.jpg")],
        "unreadable file in a list": [str(corpus / "a_baseline.jpg"), str(corpus / "h_broken.jpg")],
    }  # a list of videos, which stock cannot read, is read by VideoListLoader: test_sources_videos.py
    for case, source in cases.items():
        errors = []
        for enable in (False, True):
            (yolo_fastdetect.enable if enable else yolo_fastdetect.disable)()
            with pytest.raises(Exception) as error:  # noqa: PT011 - whatever stock raises, ours must raise it
                list(model.predict(source, stream=True, imgsz=IMGSZ))
            errors.append((type(error.value), str(error.value)))
        assert errors[1] == errors[0], case


def test_streams_urls_and_arrays_stay_stock(corpus, monkeypatch):
    image = np.zeros((8, 8, 3), np.uint8)
    for source in (0, "0", "rtsp://host/stream", "https://host/a.jpg", "screen", image, [image],
                   [str(corpus / "a_baseline.jpg"), image], ["https://host/a.jpg"], [], torch.zeros(1, 3, 32, 32)):
        assert sources.file_loader(source) is None, source
    assert isinstance(sources.file_loader(str(corpus)), FileLoader)
    monkeypatch.setenv(sources.SOURCES_VARIABLE, "0")
    assert sources.file_loader(str(corpus)) is None


def test_settings_are_validated(monkeypatch):
    monkeypatch.setenv(sources.THREADS_VARIABLE, "3")
    monkeypatch.setenv(sources.READ_AHEAD_VARIABLE, "5")
    assert sources.decode_threads() == 3 and sources.read_ahead() == 5
    for value in ("0", "-2", "many", "1.5"):
        monkeypatch.setenv(sources.THREADS_VARIABLE, value)
        with pytest.raises(ValueError, match=sources.THREADS_VARIABLE):
            sources.decode_threads()
    monkeypatch.delenv(sources.THREADS_VARIABLE)
    assert sources.decode_threads() >= 1
