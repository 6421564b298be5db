"""A Python list of videos (:class:`VideoListLoader`) against stock Ultralytics run on each video alone, with the same
model and arguments: every frame of every video, its path, frame index and boxes; the delivery order; streaming; and
bad files (cut, garbage appended, empty, no frames, not a video, missing): stock's outcome for that file or one
error naming it, never a hang, a thread left running or a lost frame of the other videos.

Stock cannot read a list of videos at all (it opens every entry as an image), so the reference is stock per video."""

from __future__ import annotations

import functools
import re
import threading
import time
from copy import copy
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from ultralytics.data.loaders import LoadImagesAndVideos
from ultralytics.engine.predictor import _prefetch

import video_corpus
import yolo_fastdetect
from test_sources import model  # noqa: F401 - a fixture: test_sources' seeded model, scores without ties
from test_sources_upload import taken  # noqa: F401 - a fixture: what each batch's take_uploads returned
from video_corpus import write_broken, write_h264, write_opencv
from yolo_fastdetect import pinned
from yolo_fastdetect.pinned import pinned_tensor_of
from yolo_fastdetect.sources import FileLoader, PathListLoader, VideoListLoader, decode_threads, file_loader
from yolo_fastdetect.sources import upload as upload_module
from yolo_fastdetect.sources import video_list as video_list_module
from yolo_fastdetect.sources.video import VIDEO_END, VideoFrame, VideoReader, videos_open_at_once

IMGSZ = 160
TIMEOUT_S = 120  # a run that takes longer has hung
THREAD_PREFIXES = ("yolo_fastdetect_decode", "yolo_fastdetect_video")  # the loaders' threads (not the predictor's)
FRAME = re.compile(r"^video (\d+)/(\d+) \(frame (\d+)/(\d+)\) (.+?): ")  # stock's info string of a frame


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> list[Path]:
    """Three clips with motion: two of 160x120 (mp4v, MJPG) and one of the odd size 171x97, of unequal lengths."""
    root = tmp_path_factory.mktemp("clips")
    return [write_opencv(root / "a.mp4", 12, 160, 120), write_opencv(root / "b.mp4", 10, 171, 97, start=3),
            write_opencv(root / "c.avi", 8, 160, 120, fourcc="MJPG", start=5)]


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    yolo_fastdetect.enable()
    assert [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIXES)] == []


def within(seconds: float, function):
    """``function()``'s value, or its error, from a thread that must end within ``seconds`` (no hang)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = function()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"no end within {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def predict(model, source, frames: list | None = None, **kwargs) -> list[tuple[str, int, int, torch.Tensor]]:
    """``model.predict(source, stream=True)``: per frame (path, frame, frames, boxes), frame numbers read from each
    batch's ``info``. ``frames`` (when given) collects them as they come, so that they stay when the run raises."""
    frames = [] if frames is None else frames
    infos: list[str] = []

    def on_batch_end(predictor):
        infos.extend(predictor.batch[2])

    model.predictor = None
    model.add_callback("on_predict_batch_end", on_batch_end)
    try:
        for result in model.predict(source, stream=True, imgsz=IMGSZ, **kwargs):
            match = FRAME.match(infos[len(frames)])
            assert match and match[5] == result.path, infos[len(frames)]
            frames.append((result.path, int(match[3]), int(match[4]), result.boxes.data.clone()))
    finally:
        model.callbacks["on_predict_batch_end"].remove(on_batch_end)
    return frames


def stock_per_video(model, videos: list[Path], **kwargs) -> dict[str, list]:
    yolo_fastdetect.disable()
    try:
        return {str(v.absolute()): predict(model, str(v), **kwargs) for v in videos}
    finally:
        yolo_fastdetect.enable()


def assert_same_frames(ours: list, stock: dict[str, list], atol: float = 1e-4) -> None:
    """Every frame of every video once, in frame order within its video, equal to stock's on that video alone (boxes
    within ``atol`` px: the fused decode rounds differently)."""
    by_video = {path: [frame for frame in ours if frame[0] == path] for path in stock}
    assert sum(map(len, by_video.values())) == len(ours)
    for path, frames in by_video.items():
        assert [f[1:3] for f in frames] == [f[1:3] for f in stock[path]], path  # frame f/F, in order
        for (_, index, _, boxes), (*_, stock_boxes) in zip(frames, stock[path]):
            assert boxes.shape == stock_boxes.shape, (path, index)
            assert torch.equal(boxes[:, 5], stock_boxes[:, 5]), (path, index)
            torch.testing.assert_close(boxes, stock_boxes, atol=atol, rtol=0)


@pytest.mark.parametrize(("batch", "vid_stride"), [(1, 1), (2, 1), (3, 2), (16, 1)])
def test_list_of_videos_matches_stock_per_video(model, clips, batch, vid_stride):
    stock = stock_per_video(model, clips, batch=batch, vid_stride=vid_stride)
    ours = within(TIMEOUT_S, lambda: predict(model, [str(c) for c in clips], batch=batch, vid_stride=vid_stride))
    assert isinstance(model.predictor.dataset, VideoListLoader)
    assert_same_frames(ours, stock)
    if batch == 1:  # round-robin across the open videos (at least two): a's first frame, then b's
        assert [f[:2] for f in ours[:2]] == [(str(clips[0].absolute()), 1), (str(clips[1].absolute()), 1)]


@pytest.mark.cuda
@pytest.mark.parametrize(("videos", "batch"), [(3, 1), (3, 2), (1, 2)])
def test_list_of_videos_on_a_gpu_letterboxes_from_the_uploads(model, clips, taken, monkeypatch, videos, batch):
    """At batch 1, and at any batch for several videos (each on a reader thread of its own), the readers upload their
    frames and every batch hands its copies to the letterbox; one video above batch 1 is uploaded by the predictor.
    Stock's boxes either way (TF32 off: stock's DFL convolution would round otherwise)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    clips = clips[:videos]
    stock = stock_per_video(model, clips, batch=batch, device="cuda")
    taken.clear()
    ours = within(TIMEOUT_S, lambda: predict(model, [str(c) for c in clips], batch=batch, device="cuda"))
    assert isinstance(model.predictor.dataset, VideoListLoader)
    assert_same_frames(ours, stock, atol=1e-3)
    uploaded_ahead = batch == 1 or videos > 1
    assert taken and all((copies is not None) == uploaded_ahead for copies in taken)


@pytest.mark.parametrize(("videos", "batch", "tracking", "uploaded_ahead"),
                         [(3, 1, False, True), (3, 8, False, True), (1, 8, False, False), (3, 8, True, False),
                          (3, 1, True, True)])
def test_a_gpu_predictors_readers_upload_at_batch_1_and_for_several_videos(clips, monkeypatch, videos, batch, tracking,
                                                                            uploaded_ahead):
    """The choice file_loader makes for a GPU predictor, on any machine: one video at batch 8 is read by one thread,
    which the uploads would slow, and so is a tracker's list, taken one video at a time; several videos read in turn
    have a reader each, and the predictor's thread bounds them."""
    made = {}
    monkeypatch.setattr(yolo_fastdetect.sources, "VideoListLoader", lambda paths, batch, *a, **options: made.update(
        options))
    paths = [str(c) for c in clips[:videos]]
    file_loader(paths, batch=batch, device=torch.device("cuda", 0), tracking=tracking)
    assert (made["upload_to"] is not None) == uploaded_ahead and made["interleave"] == (not tracking)
    monkeypatch.setenv("YOLO_FASTDETECT_UPLOAD_AHEAD", "0")
    file_loader(paths, batch=batch, device=torch.device("cuda", 0), tracking=tracking)
    assert made["upload_to"] is None


@pytest.mark.cuda
@pytest.mark.parametrize("vid_stride", [1, 3])
@pytest.mark.parametrize("mode", ["upload-ahead", "over the budget"])
def test_an_uploading_reader_retrieves_into_pinned_memory(clips, monkeypatch, vid_stride, mode):
    """With upload-ahead the reader retrieves each frame after the first into pinned memory and uploads it from there
    without a copy, none once the pinned memory in use would exceed the budget: the same frames as a plain reader,
    each GPU copy equal to its frame."""
    if mode == "over the budget":
        monkeypatch.setattr(pinned, "PINNED_BUDGET_BYTES", 0)
    uploads = upload_module.Uploads(torch.device("cuda", 0), capacity=1000)
    for clip in clips:
        plain = within(TIMEOUT_S, functools.partial(read_frames, str(clip), vid_stride, None))
        ours = within(TIMEOUT_S, functools.partial(read_frames, str(clip), vid_stride, uploads))
        assert len(ours) == len(plain) > 1
        assert all(np.array_equal(a.image, b.image) and a.last == b.last for a, b in zip(ours, plain))
        assert all((pinned_tensor_of(frame.image) is not None) == (mode != "over the budget") for frame in ours[1:])
        assert all(pinned_tensor_of(frame.image) is None for frame in plain)
        copies = uploads.take([frame.upload for frame in ours])
        torch.cuda.synchronize()
        assert all(torch.equal(copy.cpu(), torch.from_numpy(frame.image)) for copy, frame in zip(copies, ours))


def read_frames(path: str, vid_stride: int, uploads: upload_module.Uploads | None) -> list:
    """The :class:`VideoFrame` items a :class:`VideoReader` of ``path`` gives, until the video's last or its end."""
    reader = VideoReader([path], vid_stride, gray=False, capacity=4, upload_ahead=uploads)
    frames = []
    try:
        while True:
            item = reader.get()
            if isinstance(item, VideoFrame):
                frames.append(item)
            if item is VIDEO_END or (isinstance(item, VideoFrame) and item.last):
                return frames
    finally:
        reader.close()


def stock_batches(video: Path, batch: int, vid_stride: int) -> list[list[tuple[int, np.ndarray]]]:
    """Stock's batches of ``video`` alone: per batch, (frame index, image) of each frame."""
    batches = [[(int(FRAME.match(i)[3]), image) for image, i in zip(images, info)]
               for _, images, info in LoadImagesAndVideos(str(video), batch=batch, vid_stride=vid_stride)]
    return batches


@pytest.mark.parametrize(("batch", "vid_stride"), [(4, 2), (5, 1)])
def test_every_batch_is_stocks_batch_of_its_video_alone(clips, batch, vid_stride):
    """Each batch is one of stock's batches of one video alone (the same frames, so the same batch size; the last one
    the remainder: 12, 10 and 8 frames, two sizes), handed out round-robin across the two open videos, a video that
    ends giving its place to the next one."""
    loader = VideoListLoader([str(c) for c in clips], batch=batch, vid_stride=vid_stride, open_videos=2)
    ours = within(TIMEOUT_S, lambda: [(paths, [(int(FRAME.match(i)[3]), image) for image, i in zip(images, info)])
                                      for paths, images, info in loader])
    stock = {str(c.absolute()): stock_batches(c, batch, vid_stride) for c in clips}
    for paths, _ in ours:
        assert len(set(paths)) == 1  # one video per batch
    for path, batches in stock.items():
        mine = [frames for paths, frames in ours if paths[0] == path]
        assert [[index for index, _ in frames] for frames in mine] == [[index for index, _ in frames]
                                                                        for frames in batches], path
        for frames, stock_frames in zip(mine, batches):
            assert all(np.array_equal(image, stock_image) for (_, image), (_, stock_image) in zip(frames, stock_frames))
    a, b, c = stock
    rounds = {(4, 2): [a, b, a, b, c],  # frames after the stride: 6 = 4 + 2, 5 = 4 + 1, 4
              (5, 1): [a, b, a, b, a, c, c]}  # 12 = 5 + 5 + 2 (c takes b's place), 10 = 5 + 5, 8 = 5 + 3
    assert [paths[0] for paths, _ in ours] == rounds[batch, vid_stride]


def test_track_order_hands_out_each_video_whole(clips):
    """With ``interleave=False`` (``model.track``) the videos come whole, in list order, while the next ones decode."""
    loader = VideoListLoader([str(c) for c in clips], batch=4, open_videos=3, interleave=False)
    paths = within(TIMEOUT_S, lambda: [p for batch_paths, _, _ in loader for p in batch_paths])
    assert paths == [str(c.absolute()) for c, n in zip(clips, (12, 10, 8)) for _ in range(n)]


class CountingUploads:
    """In place of :class:`Uploads` on the CPU: handles that record how many frames are held at once, and whether
    each batch still holds its uploads when the consumer takes them."""

    def __init__(self, device, capacity: int):
        self.device, self.capacity = device, capacity
        self.held: set[int] = set()
        self.most = 0
        self.missing = 0  # batches whose uploads were dropped before the take
        self.lock = threading.Lock()

    def put(self, image):
        handle = SimpleNamespace(image=image)
        with self.lock:
            self.held.add(id(handle))
            self.most = max(self.most, len(self.held))
        return handle

    def take(self, handles) -> None:
        with self.lock:
            self.missing += not all(id(handle) in self.held for handle in handles)
            self.held -= {id(handle) for handle in handles}

    def clear(self) -> None:
        with self.lock:
            self.held.clear()


def consume_as_stock_on_a_gpu(loader, uploads: CountingUploads) -> int:
    """Stock's CUDA loop over ``loader``: ``_prefetch`` reads the next batch on a thread while this one is used; each
    batch's uploads are taken a little later (the predictor letterboxes them). The frames seen."""
    frames = 0
    for (paths, images, _), _ in _prefetch((batch, copy(loader)) for batch in loader):
        time.sleep(0.01)  # the readers fill their queues meanwhile, and the prefetch thread asks for the next batch
        uploads.take(images.uploads)
        frames += len(paths)
    return frames


@pytest.mark.parametrize("batch", [1, 3])
def test_uploads_hold_every_frame_in_flight_until_taken(clips, monkeypatch, batch):
    """The uploads' capacity is the frames a list can hold in flight (each open reader's batch ahead, the frame it
    waits to hand over, the prefetched batch and the predictor's): never exceeded, so none is dropped before its
    batch takes it, the last batch's included (the loader's end does not drop them: close() does)."""
    monkeypatch.setattr(video_list_module, "Uploads", CountingUploads)
    videos = [str(c) for c in (*clips, *clips)]
    loader = VideoListLoader(videos, batch=batch, open_videos=3, upload_to=torch.device("cpu"))
    uploads = loader.uploads
    assert uploads.capacity == video_list_module.frames_in_flight(3, batch)
    assert within(TIMEOUT_S, lambda: consume_as_stock_on_a_gpu(loader, uploads)) == 2 * (12 + 10 + 8)
    assert uploads.most <= uploads.capacity and uploads.missing == 0
    loader.close()
    assert not uploads.held


@pytest.mark.parametrize("batch", [1, 2])
def test_a_folders_uploads_hold_every_frame_in_flight_until_taken(clips, tmp_path, monkeypatch, batch):
    """A folder of videos decoding three at once: the uploads' capacity covers each open reader's batch ahead and the
    frame it waits to hand over, the prefetched batch and the predictor's; FileLoader's end (stock's prefetch thread
    asking past the last batch) leaves the last batch's uploads to it."""
    monkeypatch.setattr(upload_module, "Uploads", CountingUploads)
    folder = folder_of({clip.name: clip for clip in clips}, tmp_path / "videos")
    loader = FileLoader(str(folder), batch=batch, threads=3, upload_to=torch.device("cpu"))
    uploads = loader.uploads
    assert within(TIMEOUT_S, lambda: consume_as_stock_on_a_gpu(loader, uploads)) == 12 + 10 + 8
    assert uploads.most <= uploads.capacity and uploads.missing == 0
    loader.close()


def test_first_results_come_before_the_last_video_opens(model, clips, monkeypatch):
    monkeypatch.setenv("YOLO_FASTDETECT_DECODE_THREADS", "2")  # two videos open at once
    opened: list[str] = []
    reader = video_list_module.VideoReader

    def recording_reader(paths, *args, **kwargs):
        opened.extend(paths)
        return reader(paths, *args, **kwargs)

    monkeypatch.setattr(video_list_module, "VideoReader", recording_reader)
    videos = [str(clips[0])] * 7 + [str(clips[2])]
    model.predictor = None
    stream = model.predict(videos, stream=True, imgsz=IMGSZ, batch=2)
    first = within(TIMEOUT_S, lambda: next(stream))
    assert first.path == str(clips[0].absolute()) and len(opened) < len(videos)
    stream.close()  # the readers stop: the autouse fixture checks that no thread is left


@pytest.mark.skipif(video_corpus.av is None, reason="needs PyAV (av) to write H.264")
def test_h264_videos_match_stock_per_video(model, tmp_path):
    videos = [write_h264(tmp_path / "h1.mp4", 12, 160, 120), write_h264(tmp_path / "h2.mp4", 9, 160, 96, start=2)]
    stock = stock_per_video(model, videos, batch=4)
    ours = within(TIMEOUT_S, lambda: predict(model, [str(v) for v in videos], batch=4))
    assert_same_frames(ours, stock)


@pytest.mark.parametrize("kind", ["cut", "cut_mp4", "garbage_appended", "empty", "no_frames", "not_video", "missing"])
def test_a_bad_video_keeps_stock_outcome_and_the_other_videos(model, clips, tmp_path, kind):
    """The bad file between two good ones: its frames as stock reads it alone, or stock's error for it (raised up
    front where a look at the file shows it, else after every frame of the other videos)."""
    bad = write_broken(tmp_path)[kind]
    good = [clips[0], clips[2]]
    yolo_fastdetect.disable()
    try:
        stock_bad = predict(model, str(bad), batch=2)
        stock_error = None
    except Exception as error:  # noqa: BLE001 - recorded: ours must raise the same
        stock_bad, stock_error = [], error
    stock = {**stock_per_video(model, good, batch=2), **({str(bad.absolute()): stock_bad} if stock_bad else {})}
    frames: list = []
    source = [str(good[0]), str(bad), str(good[1])]
    if stock_error is None:
        within(TIMEOUT_S, lambda: predict(model, source, frames, batch=2))
        assert_same_frames(frames, stock)
        return
    with pytest.raises(type(stock_error)) as error:
        within(TIMEOUT_S, lambda: predict(model, source, frames, batch=2))
    assert str(error.value) == str(stock_error)  # stock's message, naming the file
    if kind in ("empty", "missing"):
        assert frames == []  # a look at the file shows it: raised before any frame
    else:
        assert_same_frames(frames, stock)  # the other videos' frames all came first


def test_lists_that_stay_elsewhere(clips, tmp_path):
    """A list that mixes videos and images raises (stock cannot read it either: it opens the video as an image);
    lists of images and live sources keep their loaders."""
    image = tmp_path / "a.jpg"
    cv2.imwrite(str(image), video_corpus.panning_frames(1, 64, 48)[0])
    with pytest.raises(ValueError, match=r"mixes videos .*a\.mp4.* with images .*a\.jpg"):
        file_loader([str(clips[0]), str(image)])
    assert isinstance(file_loader([str(image)]), PathListLoader)
    live = tmp_path / "live.streams"  # a file with one live entry stays stock's (latest-frame semantics)
    live.write_text(f"{clips[0]}\nrtsp://host/a\n")
    missing = tmp_path / "missing.streams"  # a file that is not there: stock's error
    missing.write_text(f"{clips[0]}\n{tmp_path / 'gone.mp4'}\n")
    for source in ("list.streams", "rtsp://host/a.mp4", 0, ["https://host/a.mp4"], str(live), str(missing)):
        assert file_loader(source) is None, source


@pytest.mark.parametrize("batch", [1, 3])
def test_a_streams_file_of_local_videos_matches_stock_per_video(model, clips, tmp_path, monkeypatch, batch):
    """A ``.streams`` file of video files (one relative to the working directory): every frame of each, as stock
    predicts each alone (stock's LoadStreams would drop frames of files)."""
    monkeypatch.chdir(clips[0].parent)
    streams = tmp_path / "videos.streams"
    streams.write_text(f"{clips[0].name}\n{clips[1]}\n{clips[2]}\n")
    stock = stock_per_video(model, clips, batch=batch, vid_stride=2)
    ours = within(TIMEOUT_S, lambda: predict(model, str(streams), batch=batch, vid_stride=2))
    assert isinstance(model.predictor.dataset, VideoListLoader)
    assert_same_frames(ours, stock)


def test_open_videos_are_bounded(clips, monkeypatch):
    """Many videos: at most as many readers (threads, open files) at once as decoder threads, every frame still
    read."""
    monkeypatch.setenv("YOLO_FASTDETECT_DECODE_THREADS", "3")
    videos = [str(clips[0]), str(clips[2])] * 6
    loader = file_loader(videos, batch=3)

    def per_batch() -> list[tuple[int, int]]:  # (frames, reader threads alive)
        return [(len(paths), sum(t.name == "yolo_fastdetect_video" for t in threading.enumerate()))
                for paths, _, _ in loader]

    counts = within(TIMEOUT_S, per_batch)
    assert sum(frames for frames, _ in counts) == 6 * (12 + 8)
    assert max(readers for _, readers in counts) == 3


def test_track_follows_one_video_at_a_time(model, clips):
    """``model.track`` on a list of videos: Ultralytics resets its one tracker when the path changes, so the videos
    are read one after another (even at batch 4), and each video's track IDs are stock's on that video alone."""
    pytest.importorskip("lap", reason="Ultralytics' tracker needs lap")

    def track_ids(source) -> list[tuple[str, list[int] | None]]:
        model.predictor = None
        return [(r.path, None if r.boxes.id is None else r.boxes.id.int().tolist())
                for r in model.track(source, stream=True, imgsz=IMGSZ, batch=4)]

    yolo_fastdetect.disable()
    stock = [frame for clip in clips for frame in track_ids(str(clip))]
    yolo_fastdetect.enable()
    ours = within(TIMEOUT_S, lambda: track_ids([str(clip) for clip in clips]))
    assert isinstance(model.predictor.dataset, VideoListLoader)
    assert ours == stock and any(ids for _, ids in stock)


def test_saved_videos_match_stock_per_video(model, clips, tmp_path):
    """``save=True``: one video written per input video, as stock writes it on that video alone: the same names,
    frame counts and frame rates (a 25 FPS clip of the 10 FPS clips' size takes batches of its own)."""
    videos = [write_opencv(tmp_path / "fast.mp4", 9, 160, 120, start=1, fps=25), *clips]  # beside a, of its size
    yolo_fastdetect.disable()
    for video in videos:
        model.predictor = None
        list(model.predict(str(video), stream=True, imgsz=IMGSZ, batch=3, save=True, project=str(tmp_path),
                           name="stock", exist_ok=True))
    yolo_fastdetect.enable()
    model.predictor = None
    within(TIMEOUT_S, lambda: list(model.predict([str(v) for v in videos], stream=True, imgsz=IMGSZ, batch=3,
                                                 save=True, project=str(tmp_path), name="ours")))

    def saved(folder: Path) -> dict[str, tuple[int, float]]:
        out = {}
        for file in sorted(folder.iterdir()):
            capture = cv2.VideoCapture(str(file))
            out[file.name] = (int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), capture.get(cv2.CAP_PROP_FPS))
            capture.release()
        return out

    stock = saved(tmp_path / "stock")
    assert saved(tmp_path / "ours") == stock and len(stock) == 4 and stock["fast.avi"][1] == 25


def folder_of(videos: dict[str, Path], folder: Path) -> Path:
    """``folder`` holding a copy of each video under its key (names sort as the keys do)."""
    folder.mkdir()
    for name, video in videos.items():
        (folder / name).write_bytes(video.read_bytes())
    return folder


def batches_until_end(loader, readers_seen: list[int]) -> tuple[list, BaseException | None]:
    """Each batch as (paths, images, info) until the loader ends or raises, and what it raised; ``readers_seen``
    gets the video reader threads alive at each batch."""
    batches, error = [], None
    try:
        for paths, images, info in loader:
            batches.append((list(paths), [image.copy() for image in images], list(info)))
            readers_seen.append(sum(t.name == "yolo_fastdetect_video" for t in threading.enumerate()))
    except FileNotFoundError as raised:
        error = raised
    return batches, error


def assert_same_batches(ours: list, stock: list) -> None:
    assert [b[0] for b in ours] == [b[0] for b in stock] and [b[2] for b in ours] == [b[2] for b in stock]
    for (paths, images, _), (_, stock_images, _) in zip(ours, stock):
        assert all(np.array_equal(a, b) for a, b in zip(images, stock_images, strict=True)), paths


@pytest.mark.parametrize(("batch", "vid_stride"), [(1, 1), (3, 2), (16, 1)])
def test_a_folder_of_videos_is_stocks_with_the_next_videos_decoding_ahead(clips, tmp_path, batch, vid_stride):
    """A folder of five videos, three decoder threads: stock's batches, frames and info strings, in stock's order
    (each video whole, the next one's frames never in its batch), while up to three videos decode at once."""
    names = ("1.mp4", "2.mp4", "3.avi", "4.mp4", "5.avi")
    folder = folder_of(dict(zip(names, (clips[0], clips[1], clips[2], clips[1], clips[2]))), tmp_path / "videos")
    stock = list(LoadImagesAndVideos(str(folder), batch=batch, vid_stride=vid_stride))
    readers: list[int] = []
    loader = FileLoader(str(folder), batch=batch, vid_stride=vid_stride, threads=3)
    ours, error = within(TIMEOUT_S, lambda: batches_until_end(loader, readers))
    assert error is None
    assert_same_batches(ours, [(list(p), list(i), list(s)) for p, i, s in stock])
    assert loader.open_videos == 3 and 1 < max(readers) <= 3


@pytest.mark.parametrize("kind", ["cut", "garbage_appended", "empty", "no_frames", "not_video"])
def test_a_bad_video_in_a_folder_ends_as_in_stock(clips, tmp_path, kind):
    """The bad file between two good ones, the next ones decoding ahead: stock's frames up to it, and its error
    where stock raises one (before the frames of the videos after it), or its frames and the rest."""
    bad = write_broken(tmp_path / "broken")[kind]
    folder = folder_of({"1.mp4": clips[0], f"2.{bad.suffix[1:]}": bad, "3.avi": clips[2]}, tmp_path / "videos")
    stock_batches: list = []
    stock_error = None
    try:
        for paths, images, info in LoadImagesAndVideos(str(folder), batch=2):
            stock_batches.append((list(paths), [image.copy() for image in images], list(info)))
    except FileNotFoundError as raised:
        stock_error = raised
    ours, error = within(TIMEOUT_S, lambda: batches_until_end(FileLoader(str(folder), batch=2, threads=3), []))
    assert_same_batches(ours, stock_batches)
    assert str(error) == str(stock_error)


def test_videos_open_at_once_keep_the_frames_ahead_bounded(clips, tmp_path):
    """One video per decoder thread, at least two, never more than 72 frames ahead (a batch and one per reader):
    eight videos at batch 8 all at once."""
    assert [videos_open_at_once(15, batch) for batch in (1, 8, 15, 31, 64)] == [15, 8, 4, 2, 2]
    assert videos_open_at_once(1, 1) == 2
    folder = folder_of({f"{index}.mp4": clips[0] for index in range(5)}, tmp_path / "videos")
    assert FileLoader(str(folder), batch=32, threads=15).open_videos == 2
    assert FileLoader(str(folder), batch=4, threads=15).open_videos == 5  # no more than the folder's videos
    assert FileLoader(str(clips[0]), batch=4, threads=15).open_videos == 1
    assert file_loader([str(clips[0])] * 20, batch=8).open_videos == videos_open_at_once(decode_threads(), 8)
