"""The decoder process (``yolo_fastdetect.sources.video_process``): the items a reader thread gives, for every clip
kind and ``vid_stride``; a frame of another shape than the first; stock's error for a video that does not open; one
error naming the file where the process dies; no process left behind, however the reader ends."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from resizing_stock_video import reshaped

import video_corpus
from conftest import video_decoder_processes
from video_corpus import write_h264, write_opencv
from yolo_fastdetect.sources import video_process as video_process_module
from yolo_fastdetect.sources.stock_video import VIDEO_END, VideoFrame
from yolo_fastdetect.sources.video import VideoReader, open_reader
from yolo_fastdetect.sources.video_process import VideoProcess, process_decoding_applies

needs_memfd = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="the decoder process needs memfd (Linux)")
pytestmark = needs_memfd


@pytest.fixture(autouse=True)
def no_process_left():
    yield
    gc.collect()
    assert video_decoder_processes() == []


def read_all(reader) -> list:
    """Every item of ``reader`` to the end of its video, then the reader closed."""
    items = []
    try:
        while True:
            items.append(reader.get())
            if items[-1] is VIDEO_END or (isinstance(items[-1], VideoFrame) and items[-1].last):
                return items
    finally:
        reader.close()


def assert_same_items(ours: list, stock: list) -> None:
    assert len(ours) == len(stock) and ours[0] == stock[0]  # the VideoStart: frame rate and count
    for index, (a, b) in enumerate(zip(ours[1:], stock[1:]), 1):
        if b is VIDEO_END:
            assert a is VIDEO_END, index
        else:
            assert a.last == b.last and a.image.dtype == b.image.dtype, index
            assert np.array_equal(a.image, b.image), index


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict:
    """An odd-sized mp4v clip, an MJPG clip, and an H.264 clip with B-frames where PyAV is installed."""
    root = tmp_path_factory.mktemp("process_clips")
    clips = {"mp4v": write_opencv(root / "a.mp4", 13, 171, 97), "mjpg": write_opencv(root / "b.avi", 9, 160, 120,
                                                                                      fourcc="MJPG", start=2)}
    if video_corpus.av is not None:
        clips["h264"] = write_h264(root / "c.mp4", 17, 192, 108, start=1)
    return clips


@pytest.mark.parametrize("kind", ["mp4v", "mjpg", "h264"])
@pytest.mark.parametrize("vid_stride", [1, 2, 3])
def test_the_process_gives_the_reader_threads_items(clips, kind, vid_stride):
    if kind not in clips:
        pytest.skip("needs PyAV (av) to write H.264")
    path = str(clips[kind])
    stock = read_all(VideoReader([path], vid_stride, gray=False, capacity=4))
    ours = read_all(VideoProcess(path, vid_stride, slots=3))
    assert_same_items(ours, stock)


def test_a_frame_of_another_shape_comes_whole(clips, monkeypatch):
    """A capture whose every third frame is larger than the first (cv2 itself keeps a stream's first size): those
    frames pass through the pipe, the others through the slots."""
    path = str(clips["mp4v"])
    stock = [frame for frame in read_all(VideoReader([path], 1, gray=False, capacity=4))[1:]]
    expected = [reshaped(frame.image, index) for index, frame in enumerate(stock, 1)]
    monkeypatch.setattr(video_process_module, "_SCRIPT", str(Path(__file__).with_name("resizing_stock_video.py")))
    ours = read_all(VideoProcess(path, 1, slots=2))[1:]
    assert len(ours) == len(expected) == 13 and {image.shape for image in expected} == {(96, 170, 3), (100, 178, 3)}
    assert all(np.array_equal(a.image, b) for a, b in zip(ours, expected))


@pytest.mark.parametrize("kind", ["missing", "empty", "not_video"])
def test_a_video_that_does_not_open_raises_stocks_error(tmp_path, kind):
    path = tmp_path / f"{kind}.mp4"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "not_video":
        path.write_bytes(os.urandom(4096))
    video = VideoProcess(str(path), 1, slots=2)
    with pytest.raises(FileNotFoundError, match=f"Failed to open video {path}"):
        video.get()


def test_a_process_that_dies_raises_naming_the_file(clips):
    path = str(clips["mp4v"])
    video = VideoProcess(path, 1, slots=2)
    video.get(), video.get()  # the start, the first frame
    os.kill(video_decoder_processes()[0], signal.SIGKILL)
    with pytest.raises(RuntimeError, match=f"decoder process of {path} ended unexpectedly"):
        for _ in range(20):  # the frames already in the pipe come first
            video.get()
    assert video_decoder_processes() == []


def test_closing_or_dropping_a_reader_ends_its_process(clips):
    video = VideoProcess(str(clips["mp4v"]), 1, slots=2)
    video.get(), video.get()
    assert len(video_decoder_processes()) == 1
    video.close()
    video.close()  # idempotent
    assert video_decoder_processes() == []
    video = VideoProcess(str(clips["mjpg"]), 1, slots=2)
    video.get()
    del video
    gc.collect()
    assert video_decoder_processes() == []


def test_a_consumer_on_another_thread_gets_every_frame(clips):
    """Two slots, a consumer thread that copies slowly: the process waits for slots; every frame arrives."""
    path = str(clips["mp4v"])
    stock = read_all(VideoReader([path], 1, gray=False, capacity=2))
    ours: list = []
    consumer = threading.Thread(target=lambda: ours.extend(read_all(VideoProcess(path, 1, slots=2))))
    consumer.start()
    consumer.join(60)
    assert not consumer.is_alive()
    assert_same_items(ours, stock)


def test_where_the_process_applies(clips, monkeypatch):
    path = str(clips["mp4v"])
    assert process_decoding_applies([path], gray=False, gpu_frames=None)
    assert not process_decoding_applies([path], gray=True, gpu_frames=None)  # stock converts to grey after
    assert not process_decoding_applies([path], gray=False, gpu_frames=object())  # NVDEC reads it
    assert not process_decoding_applies([path, path], gray=False, gpu_frames=None)  # a reader thread's sequence
    monkeypatch.setenv("YOLO_FASTDETECT_VIDEO_PROCESS", "0")
    assert not process_decoding_applies([path], gray=False, gpu_frames=None)
    reader = open_reader([path], 1, gray=False, capacity=2)
    assert isinstance(reader, VideoReader)
    reader.close()


def test_frames_let_go_give_their_slots_back(tmp_path):
    """A consumer that drops each frame: the slots come back and are filled again (more frames through the shared
    memory than it has slots), each frame still the reader thread's."""
    path = str(write_opencv(tmp_path / "long.mp4", 40, 96, 64))
    stock = read_all(VideoReader([path], 1, gray=False, capacity=4))[1:]
    video = VideoProcess(path, 1, slots=4)
    video.get()
    through_slots = 0
    for expected in stock:
        frame = video.get()
        assert np.array_equal(frame.image, expected.image) and frame.last == expected.last
        through_slots += isinstance(frame.image.base, video_process_module._SlotFrame)
        del frame
        time.sleep(0.005)  # the process takes the returned slots when it next needs one
    video.close()
    assert through_slots > 4
