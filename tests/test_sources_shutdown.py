"""The source loaders' threads and files: bounded, ordered read-ahead; nothing left running or open when the
consumer stops early (break, an exception, Ctrl-C, ``disable()`` mid-stream); a decoder's error surfaces in the
caller instead of hanging."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from ultralytics.data import loaders

import yolo_fastdetect
from conftest import detecting_model
from sources_corpus import write_images, write_video
from yolo_fastdetect.sources import FileLoader, OrderedPrefetch, PathListLoader, file_loader
from yolo_fastdetect.sources import path_list as path_list_module
from yolo_fastdetect.sources import video as video_module

IMGSZ = 128
THREAD_PREFIXES = ("yolo_fastdetect_decode", "yolo_fastdetect_video")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """24 readable images (copies of the corpus' variants) and a 9-frame video."""
    root = tmp_path_factory.mktemp("many")
    images = [p for p in write_images(root / "variants") if "broken" not in p.name]
    for copy in range(24):
        shutil.copy(images[copy % len(images)], root / f"{copy:02d}_{images[copy % len(images)].name}")
    write_video(root / "z_clip.mp4", 9, 160, 128)
    return root


@pytest.fixture(scope="module")
def model():
    return detecting_model("cpu")


@pytest.fixture(autouse=True)
def nothing_left_running(folder):
    """Every test must leave no decoder thread and no open file of the sources behind."""
    yield
    yolo_fastdetect.enable()
    assert loader_threads() == []
    assert open_files_under(folder) == []


def loader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIXES)]


def open_files_under(folder: Path) -> list[str]:
    if not os.path.isdir("/proc/self/fd"):
        return []
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [t for t in targets if t.startswith(str(folder))]


def test_prefetch_keeps_order_and_its_window(generator):
    seed = int(generator.initial_seed())
    delays = random.Random(seed).choices([0.0, 0.001, 0.005], k=40)
    started: list[int] = []

    def work(index: int) -> int:
        started.append(index)
        time.sleep(delays[index])
        return index * 10

    prefetch = OrderedPrefetch(work, range(40), threads=4, window=6)
    for consumed in range(40):
        assert max(started) < consumed + 6  # never more than `window` items ahead of the consumer
        assert next(prefetch) == consumed * 10
    with pytest.raises(StopIteration):
        next(prefetch)
    assert loader_threads() == []


def test_prefetch_raises_the_error_at_its_item_and_stops():
    def work(index: int) -> int:
        if index == 3:
            raise KeyError("item 3")
        return index

    prefetch = OrderedPrefetch(work, range(100), threads=3, window=5)
    assert [next(prefetch) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="item 3"):
        next(prefetch)
    assert loader_threads() == []
    with pytest.raises(StopIteration):  # closed: nothing more comes
        next(prefetch)


def own_nice() -> int:
    """The calling thread's nice value (Linux: each thread has its own)."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="Linux only: elsewhere a thread has no nice value of its own, and none is set")


@linux_only
def test_prefetch_threads_run_five_nice_steps_below_the_caller_where_asked():
    """The decoder threads of a GPU predictor yield the CPU to its thread, which holds the GIL between its GPU calls;
    by default they run as the caller."""
    caller = own_nice()
    with OrderedPrefetch(lambda _: own_nice(), range(8), threads=3, window=8, lower_priority=True) as seen:
        assert list(seen) == [min(19, caller + 5)] * 8
    with OrderedPrefetch(lambda _: own_nice(), range(8), threads=3, window=8) as seen:
        assert list(seen) == [caller] * 8
    assert own_nice() == caller  # the caller's own is untouched


@linux_only
@pytest.mark.parametrize(("device", "nice"), [(None, None), ("cuda", None), ("cuda", "0")],
                         ids=["cpu-predictor", "gpu-predictor", "gpu-predictor-opted-out"])
def test_file_sources_decode_below_a_gpu_predictor_only(folder, monkeypatch, device, nice):
    """file_loader gets the predictor's device where it letterboxes on a GPU: only then do the decoders yield (on a CPU
    predictor the network's own threads do the work), unless YOLO_FASTDETECT_DECODER_NICE=0. No GPU is touched: at
    batch 2 nothing is uploaded ahead."""
    if nice is not None:
        monkeypatch.setenv("YOLO_FASTDETECT_DECODER_NICE", nice)
    seen = []
    stock_imread = loaders.imread
    monkeypatch.setattr(loaders, "imread", lambda *a, **k: seen.append(own_nice()) or stock_imread(*a, **k))
    loader = file_loader(str(folder / "*.jpg"), batch=2, device=None if device is None else torch.device(device))
    assert sum(len(images) for _, images, _ in loader) > 0
    caller = own_nice()
    assert set(seen) == {min(19, caller + 5) if device and nice is None else caller}


@pytest.mark.parametrize("loader", ["folder", "list"])
def test_read_ahead_is_bounded(folder, monkeypatch, loader):
    """Memory stays flat: after the first batch, at most read_ahead batches (or one image per thread) have been
    decoded beyond it, whatever the length of the source."""
    calls = []
    if loader == "folder":
        stock_imread = loaders.imread
        monkeypatch.setattr(loaders, "imread", lambda *a, **k: calls.append(1) or stock_imread(*a, **k))
        source = FileLoader(str(folder / "*.jpg"), batch=2, threads=2, read_ahead=2)
    else:
        stock_autocast = path_list_module.autocast_list
        monkeypatch.setattr(path_list_module, "autocast_list", lambda x: calls.append(1) or stock_autocast(x))
        source = PathListLoader(sorted(str(p) for p in folder.glob("*.jpg")), batch=2, threads=2, read_ahead=2)
    batches = iter(source)
    paths, images, info = next(batches)
    assert len(images) == 2
    time.sleep(0.3)  # let the threads run as far ahead as they may
    assert len(calls) <= 2 + 2 * 2
    source.close()


def test_break_and_consumer_errors_stop_the_threads(model, folder):
    for _ in model.predict(str(folder), stream=True, batch=2, imgsz=IMGSZ, verbose=False):
        break
    assert loader_threads() == [] and open_files_under(folder) == []

    for error in (ValueError, KeyboardInterrupt):
        with pytest.raises(error):
            for index, _ in enumerate(model.predict(str(folder), stream=True, batch=3, imgsz=IMGSZ, verbose=False)):
                if index == 4:
                    raise error("consumer stops")
        assert loader_threads() == [] and open_files_under(folder) == []

    results = model.predict(sorted(str(p) for p in folder.glob("*.jpg")), stream=True, imgsz=IMGSZ, verbose=False)
    next(results)
    results.close()
    assert loader_threads() == []


def test_an_abandoned_stream_stops_its_threads(model, folder):
    results = model.predict(str(folder), stream=True, batch=2, imgsz=IMGSZ, verbose=False)
    next(results)
    assert loader_threads()  # decoding ahead
    del results  # garbage-collected: the generator closes, its finally closes the loader
    assert loader_threads() == []


def test_disable_mid_stream_finishes_the_stream(model, folder):
    yolo_fastdetect.disable()
    stock = [(r.path, r.orig_img.tobytes()) for r in model.predict(str(folder), stream=True, batch=4, imgsz=IMGSZ)]
    yolo_fastdetect.enable()
    results = model.predict(str(folder), stream=True, batch=4, imgsz=IMGSZ, verbose=False)
    ours = [next(results)]
    yolo_fastdetect.disable()  # the running stream keeps the loader it started with, to its end
    ours += list(results)
    assert [(r.path, r.orig_img.tobytes()) for r in ours] == stock


def test_decoder_errors_surface_in_the_caller(model, folder, monkeypatch):
    failing = sorted(folder.glob("*.jpg"))[5]
    stock_imread = loaders.imread

    def imread(path, *args, **kwargs):
        if Path(path) == failing:
            raise OSError(f"disk error reading {path}")
        return stock_imread(path, *args, **kwargs)

    monkeypatch.setattr(loaders, "imread", imread)
    with pytest.raises(OSError, match="disk error"):
        list(model.predict(str(folder), stream=True, batch=2, imgsz=IMGSZ, verbose=False))
    monkeypatch.undo()

    stock_capture = video_module.cv2.VideoCapture

    class FailingCapture:  # a wrapper: Python subclasses of cv2.VideoCapture crash the interpreter at exit
        def __init__(self, path):
            self._capture = stock_capture(path)

        def __getattr__(self, name):
            return getattr(self._capture, name)

        def retrieve(self, *args):
            raise RuntimeError("codec failure")

    monkeypatch.setattr(video_module.cv2, "VideoCapture", FailingCapture)
    with pytest.raises(RuntimeError, match="codec failure"):
        list(model.predict(str(folder / "z_clip.mp4"), stream=True, imgsz=IMGSZ, verbose=False))
    monkeypatch.undo()

    monkeypatch.setattr(path_list_module, "autocast_list", lambda paths: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        list(model.predict([str(failing)], stream=True, imgsz=IMGSZ, verbose=False))
