"""PyAV decoding to planes, converted to BGR on a device (:mod:`yolo_fastdetect.sources.av_planes`).

On the CPU (CI): every frame equal to ``cv2.VideoCapture``'s (grab and retrieve) on H.264 and HEVC clips (sizes off
the 16-pixel grid with an odd chroma width, BT.709 and SMPTE 170M tags, limited and full range, a variable frame
rate, more frames than a batch and a partial batch); the streams it refuses, naming the file; a format, size or colour
change part way (the frames before it given, then :class:`MidStreamError`); ``close`` and an abandoned iteration
releasing the file. On a GPU (skipped without one): the device frames and their pinned host copies equal cv2's.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from test_sources import assert_same_results, model, stock_and_ours  # noqa: F401
from test_sources_upload import taken  # noqa: F401
from test_sources_videos import assert_same_frames as assert_same_per_video
from test_sources_videos import predict, stock_per_video, within
from video_corpus import camera_frames, opencv_frames, write_camera_clip, write_clip, write_opencv
from yolo_fastdetect import _ext
from yolo_fastdetect.sources.av_planes import MidStreamError, PlanesVideo
from yolo_fastdetect.sources.converted_video import FETCH_FRAMES, probe_stream

pytest.importorskip("av", reason="PyAV writes the H.264 / HEVC clips and decodes them")
pytestmark = pytest.mark.skipif(not _ext.available(), reason="operators not built")


def assert_same_frames(ours: list[np.ndarray], stock: list[np.ndarray]) -> None:
    assert len(ours) == len(stock) > 0, f"{len(ours)} frames, cv2 {len(stock)}"
    for index, (mine, theirs) in enumerate(zip(ours, stock)):
        assert mine.shape == theirs.shape and mine.dtype == np.uint8, index
        assert np.array_equal(mine, theirs), f"frame {index}: {np.count_nonzero(mine != theirs)} values differ"


def open_descriptors(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    folder = Path("/proc/self/fd")
    if not folder.is_dir():
        pytest.skip("needs /proc/self/fd")
    target = str(path.resolve())
    count = 0
    for entry in folder.iterdir():
        try:
            count += os.readlink(entry) == target
        except OSError:  # the descriptor listing the folder, closed by now
            continue
    return count


# Each writes a clip to the path it is given (a seeded generator for the variable frame rate): H.264 and HEVC, widths
# of odd chroma width and off the 16-pixel grid, SMPTE 170M below 720 rows and BT.709 from there, both ranges; 12
# frames are a batch and a part of one.
CLIPS = {
    "h264_170x96_full_range": lambda path, _: write_camera_clip(path, 12, (170, 96), full_range=True),
    "hevc_98x64": lambda path, _: write_camera_clip(path, 12, (98, 64), "hevc"),
    "h264_1366x768_bt709": lambda path, _: write_camera_clip(path, 3, "1366x768"),
    "hevc_130x720_bt709_full_range": lambda path, _: write_camera_clip(path, 9, (130, 720), "hevc", full_range=True),
    "h264_vfr_160x90": lambda path, generator: write_camera_clip(path, 10, (160, 90),
                                                                 frame_times=frame_times(10, generator)),
}


def frame_times(count: int, generator: torch.Generator) -> list[float]:
    """Presentation times from 0 s with random intervals of 1/100 to 1/10 s: a variable frame rate."""
    intervals = torch.rand(count - 1, generator=generator, dtype=torch.float64) * 0.09 + 0.01
    return [0.0, *intervals.cumsum(0).tolist()]


@pytest.mark.parametrize("name", list(CLIPS))
def test_frames_equal_cv2s_on_the_cpu(tmp_path, generator, name):
    path = CLIPS[name](tmp_path / f"{name}.mp4", generator)
    tags = probe_stream(str(path))
    with PlanesVideo(str(path), "cpu") as video:
        assert video.tags == tags and video.device == torch.device("cpu")
        frames = list(video)
    for frame in frames:
        assert frame.stream is None and frame.bgr.device.type == "cpu"
        assert np.shares_memory(frame.image, frame.bgr.numpy()) and frame.image.flags.c_contiguous
    assert_same_frames([frame.image for frame in frames], opencv_frames(path))


def test_refuses_what_it_cannot_convert_as_cv2_does(tmp_path):
    mp4v = write_opencv(tmp_path / "mp4v.mp4", 4, 160, 120)  # MPEG-4 Part 2, OpenCV's own writer
    odd_height = write_clip(tmp_path / "odd.mp4", camera_frames(2, 64, 49), 64, 49, "mpeg4")
    empty, text = tmp_path / "empty.mp4", tmp_path / "text.mp4"
    empty.write_bytes(b"")
    text.write_text("not a video\n" * 50)
    for path, reason in [(mp4v, "codec mpeg4 is not H.264 or HEVC"), (odd_height, "codec mpeg4"),
                         (empty, "PyAV decodes no frame of it"), (text, "PyAV decodes no frame of it"),
                         (tmp_path / "missing.mp4", "PyAV decodes no frame of it")]:
        with pytest.raises(ValueError, match="PlanesVideo") as raised:
            PlanesVideo(str(path), "cpu")
        assert str(path) in str(raised.value) and reason in str(raised.value)


def test_refuses_tags_and_devices_it_does_not_convert(tmp_path):
    path = write_camera_clip(tmp_path / "clip.mp4", 2, (96, 64))
    tags = probe_stream(str(path))
    with pytest.raises(ValueError, match="odd height 63"):
        PlanesVideo(str(path), "cpu", replace(tags, height=63))
    with pytest.raises(ValueError, match="matrix 8"):  # YCgCo: swscale has no coefficients for it
        PlanesVideo(str(path), "cpu", replace(tags, colorspace=8))
    with pytest.raises(ValueError, match="device must be the CPU or a CUDA device, not meta"):
        PlanesVideo(str(path), "meta")


@pytest.mark.parametrize("change", ["size", "colour tags"])
def test_change_part_way_gives_the_frames_before_then_raises(tmp_path, change):
    """Two raw H.264 streams one after the other, the second of another size or tagged BT.709 (the first SMPTE 170M):
    the first's frames (a batch and a part of one) as cv2 gives them, then :class:`MidStreamError` at the second's
    first frame, naming the file and what changed."""
    first = write_camera_clip(tmp_path / "first.h264", 10, (96, 64))
    if change == "size":
        second = write_camera_clip(tmp_path / "second.h264", 4, (128, 64))
    else:
        second = write_clip(tmp_path / "second.h264", camera_frames(4, 96, 64), 96, 64, colorspace=1, primaries=1,
                            transfer=1)
    path = tmp_path / "joined.h264"
    path.write_bytes(first.read_bytes() + second.read_bytes())
    frames = []
    with PlanesVideo(str(path), "cpu") as video, pytest.raises(MidStreamError) as raised:
        for frame in video:
            frames.append(frame)
    assert isinstance(raised.value, ValueError) and raised.value.frame_index == 10 and raised.value.path == str(path)
    words = "128x64" if change == "size" else "matrix 1, range 1, primaries 1, transfer 1"
    assert str(path) in str(raised.value) and words in str(raised.value)
    stock = opencv_frames(path)
    assert len(stock) == 14  # cv2 reads on (at the first frame's size)
    assert_same_frames([frame.image for frame in frames], stock[:10])


def test_close_and_an_abandoned_iteration_release_the_file(tmp_path):
    path = write_camera_clip(tmp_path / "clip.mp4", FETCH_FRAMES + 2, (96, 64))
    stock = opencv_frames(path)
    video = PlanesVideo(str(path), "cpu")
    video.close()
    video.close()  # idempotent, before any iteration
    for frame in video:
        assert np.array_equal(frame.image, stock[0]) and open_descriptors(path) == 1
        break
    assert open_descriptors(path) == 0  # the abandoned iteration closed its file
    assert_same_frames([frame.image for frame in video], stock)  # each iteration starts over
    with video:
        frames = iter(video)
        first = next(frames)
        assert open_descriptors(path) == 1
    assert open_descriptors(path) == 0  # closed by the with block, the iteration still held
    assert next(frames, None) is None
    video.close()
    assert np.array_equal(first.image, stock[0])  # frames given stay valid


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["h264_170x96_full_range", "h264_1366x768_bt709", "hevc_130x720_bt709_full_range"])
def test_frames_equal_cv2s_on_the_gpu(tmp_path, generator, name):
    path = CLIPS[name](tmp_path / f"{name}.mp4", generator)
    with PlanesVideo(str(path), "cuda") as video:
        assert video.device == torch.device("cuda", torch.cuda.current_device())
        frames = list(video)
    for index, frame in enumerate(frames):
        assert isinstance(frame.stream, torch.cuda.Stream) and frame.stream != torch.cuda.current_stream(), index
        assert frame.bgr.device == video.device and frame.bgr.dtype == torch.uint8, index
        assert torch.from_numpy(frame.image).is_pinned(), index
        assert np.array_equal(frame.bgr.cpu().numpy(), frame.image), index
    assert_same_frames([frame.image for frame in frames], opencv_frames(path))


# model.predict on a GPU, where PyAV's planes are the default, against stock --------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize(("batch", "vid_stride"), [(1, 1), (4, 2)])
def test_predict_on_videos_matches_stock(model, taken, tmp_path, batch, vid_stride):
    folder = tmp_path / "videos"
    folder.mkdir()
    write_camera_clip(folder / "a.mp4", 9, "320x180", "h264")
    write_camera_clip(folder / "b.mp4", 11, "1366x768", "hevc")
    write_opencv(folder / "c.mp4", 5, 96, 64)  # MPEG-4 Part 2: cv2 reads it, without a word unless PyAV was asked for
    stock, ours = stock_and_ours(model, str(folder), batch=batch, vid_stride=vid_stride, device="cuda")
    assert_same_results(stock["results"], ours["results"])
    assert ours["batches"] == stock["batches"] and ours["log"] == stock["log"]
    assert taken and any(copies is not None for copies in taken)  # batches letterboxed from the converted frames


@pytest.mark.cuda
def test_a_stream_it_does_not_read_is_logged_where_asked_for(model, tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_FASTDETECT_PYAV_VIDEO", "1")
    path = write_opencv(tmp_path / "mp4v.mp4", 5, 96, 64)
    stock, ours = stock_and_ours(model, str(path), device="cuda")
    assert_same_results(stock["results"], ours["results"])
    assert {line for line in ours["log"] if line not in stock["log"]} == {
        f"yolo_fastdetect: {path} decodes with cv2, not PyAV: codec mpeg4 is not H.264 or HEVC"}


@pytest.mark.cuda
def test_a_list_of_videos_matches_stock_per_video(model, tmp_path):
    clips = [write_camera_clip(tmp_path / "a.mp4", 7, "320x180", "h264"),
             write_camera_clip(tmp_path / "b.mp4", 5, "320x180", "hevc"),
             write_camera_clip(tmp_path / "c.mp4", 4, "854x480", "h264")]
    stock = stock_per_video(model, clips, batch=2, device="cuda")
    ours = within(120, lambda: predict(model, [str(c) for c in clips], batch=2, device="cuda"))
    assert_same_per_video(ours, stock)
