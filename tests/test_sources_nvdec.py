"""NVDEC video decoding (:mod:`yolo_fastdetect.sources.nvdec`, ``YOLO_FASTDETECT_GPU_VIDEO=1``).

On the CPU (CI): where NVDEC may read (a missing package, no GPU; which streams: test_sources_converted_video.py), the
video reader's NVDEC path with a stand-in decoder: stock's frames, ``vid_stride``, counters and end, and cv2 reading
on where the decoder fails mid-video. On a GPU with PyNvVideoCodec (skipped without it): each frame equal to
``cv2.VideoCapture``'s, H.264 and HEVC, several sizes; ``model.predict`` with the switch against stock on a video, a
truncated video and a list of videos, every batch letterboxed from the NVDEC frames.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from test_sources import assert_same_results, captured_log, model, restore_patch, stock_and_ours  # noqa: F401
from test_sources_converted_video import BT709_LIMITED
from test_sources_upload import taken  # noqa: F401
from test_sources_videos import TIMEOUT_S, assert_same_frames, predict, stock_per_video, within
from video_corpus import opencv_frames, write_camera_clip, write_opencv
from yolo_fastdetect.sources import VideoListLoader, converted_video, nvdec
from yolo_fastdetect.sources import video as video_module
from yolo_fastdetect.sources.converted_video import FETCH_FRAMES, ConvertedFrame, GpuVideo, StreamTags, probe_stream
from yolo_fastdetect.sources.video import VIDEO_END, VideoFrame, VideoReader, VideoStart

pytest.importorskip("av", reason="PyAV writes the H.264 / HEVC clips and reads their colour tags")

NOT_INSTALLED = "PyNvVideoCodec is not installed (pip install 'yolo-fastdetect[video]')"
# What file_loader chooses for a GPU predictor with YOLO_FASTDETECT_GPU_VIDEO=1 (its frames converted on the CPU
# here, by the tests' stand-in decoder).
ASKED_FOR_NVDEC = GpuVideo(torch.device("cpu"), nvdec=True, log_skips=True)


@pytest.fixture
def fake_pynvvideocodec(monkeypatch):
    """Installs a module as ``PyNvVideoCodec`` (None: not installed), the cached import forgotten before and after."""
    def install(module):
        monkeypatch.setitem(sys.modules, "PyNvVideoCodec", module)
        nvdec._pynvvideocodec.cache_clear()

    yield install
    nvdec._pynvvideocodec.cache_clear()


def test_reason_without_the_package_or_a_gpu(fake_pynvvideocodec, tmp_path, monkeypatch):
    path = str(write_camera_clip(tmp_path / "clip.mp4", 2, "96x64"))
    fake_pynvvideocodec(None)  # import raises ImportError
    assert nvdec.nvdec_unavailable_reason(path) == NOT_INSTALLED
    with pytest.raises(ValueError, match="PyNvVideoCodec is not installed"):
        nvdec.NvdecVideo(path, torch.device("cuda", 0))
    fake_pynvvideocodec(types.ModuleType("PyNvVideoCodec"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert nvdec.nvdec_unavailable_reason(path) == "no CUDA device"


def test_the_check_hands_over_the_probed_tags(fake_pynvvideocodec, tmp_path, monkeypatch):
    fake_pynvvideocodec(types.ModuleType("PyNvVideoCodec"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(converted_video._ext, "has_cuda_kernels", lambda: True)
    h264 = str(write_camera_clip(tmp_path / "clip.mp4", 2, "96x64"))
    assert nvdec.nvdec_tags_or_reason(h264) == probe_stream(h264) == StreamTags(
        "h264", 96, 64, "yuv420p", 6, 1, 6, 6)
    assert nvdec.nvdec_unavailable_reason(h264) is None
    mpeg4 = str(write_opencv(tmp_path / "clip.avi", 2, 96, 64))
    assert nvdec.nvdec_tags_or_reason(mpeg4) == nvdec.nvdec_unavailable_reason(mpeg4) == (
        "codec mpeg4 is not H.264 or HEVC")


def test_reason_where_the_package_does_not_load(fake_pynvvideocodec, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name == "PyNvVideoCodec":
            raise RuntimeError("libnvidia-encode.so.1: cannot open shared object file\n\n=== TROUBLESHOOTING ===")
        return real_import(name, *args, **kwargs)

    fake_pynvvideocodec(None)
    monkeypatch.setattr(builtins, "__import__", failing_import)
    reason = nvdec.nvdec_unavailable_reason("any.mp4")
    assert reason == "PyNvVideoCodec does not load: libnvidia-encode.so.1: cannot open shared object file"


# One decoder per video: PyNvVideoCodec's ThreadedDecoder, with a stand-in ------------------------------------------


class StandInThreadedDecoder:
    """In place of ``PyNvVideoCodec.ThreadedDecoder``: ``frames`` numbered frames, handed out by
    ``get_batch_frames``; records the fetches and whether ``end()`` ran."""

    made: list[StandInThreadedDecoder] = []

    def __init__(self, path, buffer_size, gpu_id, cuda_context, cuda_stream, use_device_memory, output_color_type,
                 frames=20):
        self.arguments = (path, buffer_size, gpu_id, cuda_stream, use_device_memory, output_color_type)
        self.left, self.fetches, self.ended = list(range(frames)), [], False
        StandInThreadedDecoder.made.append(self)

    def get_batch_frames(self, count):
        self.fetches.append(count)
        batch, self.left = self.left[:count], self.left[count:]
        return batch

    def end(self):
        self.ended = True


@pytest.fixture
def one_threaded_decoder(tmp_path, fake_pynvvideocodec, monkeypatch):
    """An NvdecVideo (one decoder) of a real clip whose PyNvVideoCodec is the stand-in, each frame's "BGR" its
    number: no GPU needed."""
    fake_pynvvideocodec(SimpleNamespace(ThreadedDecoder=StandInThreadedDecoder,
                                        OutputColorType=SimpleNamespace(NATIVE="native")))
    monkeypatch.setattr(StandInThreadedDecoder, "made", [])
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: SimpleNamespace(cuda_stream=1234))
    monkeypatch.setattr(nvdec.NvdecVideo, "_to_bgr", lambda self, frames, stream: [(f, f) for f in frames])
    path = str(write_camera_clip(tmp_path / "clip.mp4", 2, "96x64"))
    return nvdec.NvdecVideo(path, torch.device("cuda", 3))


def test_one_decoder_fetches_batches_in_order_and_ends_its_decoder(one_threaded_decoder):
    with one_threaded_decoder as video:
        frames = [frame.bgr for frame in video]
    [decoder] = StandInThreadedDecoder.made
    assert frames == list(range(20))
    assert decoder.fetches == [FETCH_FRAMES] * 4  # 8, 8, 4, then none: the end
    assert decoder.arguments == (video._path, nvdec.THREADED_BUFFER_FRAMES, 3, 1234, True, "native")
    assert decoder.ended


def test_one_decoder_closed_early_ends_its_decoder(one_threaded_decoder):
    frames = iter(one_threaded_decoder)
    assert [next(frames).bgr for _ in range(3)] == [0, 1, 2]
    one_threaded_decoder.close()
    [decoder] = StandInThreadedDecoder.made
    assert decoder.ended and decoder.fetches == [FETCH_FRAMES]


# The reader's NVDEC path, with a stand-in decoder ----------------------------------------------------------------


class StandInDecoder:
    """In place of :class:`NvdecVideo`: cv2's frames of the file as tensors (what NVDEC must give), raising a decoder
    error after ``fail_after`` frames when set."""

    fail_after: int | None = None
    opened: list[tuple[str, StreamTags]] = []

    def __init__(self, path: str, device, tags: StreamTags, decoders: int):
        self._frames = opencv_frames(Path(path))
        StandInDecoder.opened.append((path, tags))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def __iter__(self):
        for index, image in enumerate(self._frames):
            if index == self.fail_after:
                raise RuntimeError("CUVID error: bitstream")
            yield ConvertedFrame(torch.from_numpy(image.copy()), image, None)  # (stream None: no change)


def read_all(reader: VideoReader) -> list:
    """The reader's items until its video ends: ('start', fps, frames), (image, last) per frame, 'end'."""
    items = []
    while True:
        item = reader.get()
        if isinstance(item, VideoStart):
            items.append(("start", item.fps, item.frames))
        elif isinstance(item, VideoFrame):
            items.append((item.image, item.last))
            if item.last:
                break
        else:
            assert item is VIDEO_END
            items.append(item)
            break
    reader.close()
    return items


def assert_same_items(ours: list, stock: list) -> None:
    assert len(ours) == len(stock)
    for item, stock_item in zip(ours, stock):
        if isinstance(stock_item, tuple) and isinstance(stock_item[0], np.ndarray):
            assert np.array_equal(item[0], stock_item[0]) and item[1] == stock_item[1]
        else:
            assert item == stock_item


@pytest.mark.parametrize("vid_stride", [1, 2, 3])
@pytest.mark.parametrize("fail_after", [None, 0, 4])
def test_reader_with_nvdec_gives_stock_frames_counters_and_end(tmp_path, monkeypatch, vid_stride, fail_after):
    path = str(write_camera_clip(tmp_path / "clip.mp4", 7, "96x64"))
    probed = StreamTags(*BT709_LIMITED)
    monkeypatch.setattr(video_module, "nvdec_tags_or_reason", lambda path: probed)
    monkeypatch.setattr(video_module, "NvdecVideo", StandInDecoder)
    monkeypatch.setattr(StandInDecoder, "fail_after", fail_after)
    monkeypatch.setattr(StandInDecoder, "opened", [])
    held = []
    gpu_frames = SimpleNamespace(device=torch.device("cpu"), add=lambda image, bgr: held.append((image, bgr)))
    stock = read_all(VideoReader([path], vid_stride, gray=False, capacity=2))
    with captured_log() as lines:
        ours = read_all(VideoReader([path], vid_stride, gray=False, capacity=2, gpu_frames=gpu_frames,
                                    gpu_video=ASKED_FOR_NVDEC))
    assert_same_items(ours, stock)
    assert StandInDecoder.opened == [(path, probed)]  # the tags of the check: the stream is probed once
    given = 7 // vid_stride if fail_after is None else fail_after // vid_stride  # frames before the failure
    assert len(held) == given and all(np.array_equal(image, bgr.numpy()) for image, bgr in held)
    assert all(image is bgr_image for (image, _), (bgr_image, _) in zip(held, ours[1:]))  # the frames' host copies
    failures = [line for line in lines if "NVDEC failed" in line]
    assert failures == ([] if fail_after is None else [
        f"yolo_fastdetect: NVDEC failed on {path} after {given} frames (CUVID error: bitstream); cv2 reads on"])


def test_reader_logs_why_nvdec_does_not_apply_and_reads_with_cv2(tmp_path, fake_pynvvideocodec):
    path = str(write_opencv(tmp_path / "clip.mp4", 5, 96, 64))
    fake_pynvvideocodec(None)
    gpu_frames = SimpleNamespace(device=torch.device("cpu"), add=None)
    stock = read_all(VideoReader([path], 1, gray=False, capacity=2))
    with captured_log() as lines:
        ours = read_all(VideoReader([path], 1, gray=False, capacity=2, gpu_frames=gpu_frames,
                                    gpu_video=ASKED_FOR_NVDEC))
    assert_same_items(ours, stock)
    assert lines == [f"yolo_fastdetect: {path} decodes on the CPU, not with NVDEC: {NOT_INSTALLED}"]


# On a GPU with PyNvVideoCodec ------------------------------------------------------------------------------------


@pytest.fixture
def nvdec_ready(monkeypatch):
    """Skips without PyNvVideoCodec; turns the switch on."""
    loaded = nvdec._pynvvideocodec()
    if isinstance(loaded, str):
        pytest.skip(loaded)
    monkeypatch.setenv("YOLO_FASTDETECT_GPU_VIDEO", "1")


@pytest.fixture(params=["nvdec", "pyav"])
def converting_decoder(request):
    """Each decoder whose frames the GPU converts: NVDEC (skipped without PyNvVideoCodec; the switch on), and PyAV's
    planes (the default)."""
    if request.param == "nvdec":
        request.getfixturevalue("nvdec_ready")
    return request.param


def assert_frames_equal_cv2s(path: Path, decoders: int) -> None:
    stock = opencv_frames(path)
    with nvdec.NvdecVideo(str(path), torch.device("cuda", 0), decoders=decoders) as video:
        ours = list(video)
    assert len(ours) == len(stock), f"NVDEC gave {len(ours)} frames, cv2 {len(stock)}"
    for index, (frame, image) in enumerate(zip(ours, stock)):
        assert frame.bgr.is_cuda and frame.bgr.shape == image.shape and frame.bgr.dtype == torch.uint8, index
        gap = np.abs(frame.image.astype(np.int16) - image)
        assert not gap.any(), f"frame {index}: {np.count_nonzero(gap)} values differ, by {gap.max()} at most"
        assert np.array_equal(frame.bgr.cpu().numpy(), frame.image)


@pytest.mark.cuda
@pytest.mark.parametrize(("codec", "size", "full_range"), [
    ("h264", "1366x768", False), ("hevc", "1366x768", False), ("h264", "854x480", False), ("hevc", "320x180", False),
    ("h264", "170x96", True), ("hevc", "1280x720", True),
])
def test_frames_equal_cv2s(nvdec_ready, tmp_path, codec, size, full_range):
    path = write_camera_clip(tmp_path / f"clip_{codec}.mp4", 6, size, codec, full_range=full_range)
    assert nvdec.nvdec_unavailable_reason(str(path)) is None
    assert_frames_equal_cv2s(path, decoders=1)


@pytest.mark.cuda
@pytest.mark.parametrize("decoders", [2, 3, 5])
@pytest.mark.parametrize(("codec", "gop", "container"), [
    ("h264", 4, "mp4"), ("hevc", 5, "mkv"), ("hevc", None, "mp4"),  # (x265's default: open GOPs, one segment)
])
def test_closed_gops_on_several_decoders_equal_cv2s(nvdec_ready, tmp_path, decoders, codec, gop, container):
    """B-frames across GOPs of 4 or 5 frames, 23 frames: segments of every length, the last one short."""
    path = write_camera_clip(tmp_path / f"clip_{codec}.{container}", 23, "320x180", codec, gop=gop)
    assert_frames_equal_cv2s(path, decoders)


@pytest.mark.cuda
@pytest.mark.parametrize(("batch", "vid_stride"), [(1, 1), (4, 2)])
def test_predict_on_a_video_matches_stock(nvdec_ready, model, taken, tmp_path, batch, vid_stride):
    folder = tmp_path / "videos"
    folder.mkdir()
    write_camera_clip(folder / "a.mp4", 9, "320x180", "h264")
    write_camera_clip(folder / "b.mp4", 6, "1366x768", "hevc")
    stock, ours = stock_and_ours(model, str(folder), batch=batch, vid_stride=vid_stride, device="cuda")
    assert_same_results(stock["results"], ours["results"])
    assert ours["batches"] == stock["batches"] and ours["log"] == stock["log"]  # no line: NVDEC read both
    assert taken and all(copies is not None for copies in taken)  # every batch letterboxed from the NVDEC frames


@pytest.mark.cuda
def test_a_stream_nvdec_does_not_read_is_logged_and_matches_stock(nvdec_ready, model, tmp_path):
    path = write_opencv(tmp_path / "mp4v.mp4", 5, 96, 64)
    stock, ours = stock_and_ours(model, str(path), device="cuda")
    assert_same_results(stock["results"], ours["results"])
    assert [line for line in ours["log"] if line not in stock["log"]] == [
        f"yolo_fastdetect: {path} decodes on the CPU, not with NVDEC: codec mpeg4 is not H.264 or HEVC"]


@pytest.mark.cuda
def test_a_truncated_video_ends_as_stock(converting_decoder, model, tmp_path):
    """Matroska keeps its header first, so a cut file opens and ends early, as a camera's interrupted recording."""
    path = write_camera_clip(tmp_path / "cut.mkv", 12, "320x180", "h264")
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    stock, ours = stock_and_ours(model, str(path), device="cuda")
    assert 0 < len(stock["results"]) < 12
    assert_same_results(stock["results"], ours["results"])
    assert ours["batches"] == stock["batches"]


@pytest.mark.cuda
@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_garbage_after_a_video_ends_it_as_stock(converting_decoder, model, tmp_path, codec):
    """Random bytes after the container's end (a recording that a crash left unfinished): the decoder reads the
    stream to its end, without hanging, and gives stock's frames."""
    path = write_camera_clip(tmp_path / "garbage.mp4", 12, "320x180", codec)
    path.write_bytes(path.read_bytes() + np.random.default_rng(0).bytes(5000))
    stock, ours = within(TIMEOUT_S, lambda: stock_and_ours(model, str(path), device="cuda"))
    assert len(stock["results"]) == 12
    assert_same_results(stock["results"], ours["results"])


@pytest.mark.cuda
def test_a_list_of_videos_matches_stock_per_video(nvdec_ready, model, tmp_path):
    clips = [write_camera_clip(tmp_path / "a.mp4", 7, "320x180", "h264"),
             write_camera_clip(tmp_path / "b.mp4", 5, "320x180", "hevc"),
             write_camera_clip(tmp_path / "c.mp4", 4, "854x480", "h264")]
    stock = stock_per_video(model, clips, batch=2, device="cuda")
    ours = within(120, lambda: predict(model, [str(c) for c in clips], batch=2, device="cuda"))
    assert isinstance(model.predictor.dataset, VideoListLoader) and model.predictor.dataset.uploads is not None
    assert_same_frames(ours, stock)


@pytest.mark.parametrize("log_skips", [True, False])
def test_reader_logs_why_pyav_does_not_apply_only_where_asked_for(tmp_path, log_skips):
    """PyAV's planes are the default: a video cv2 reads instead is logged only where the user set the switch."""
    path = str(write_opencv(tmp_path / "clip.mp4", 5, 96, 64))
    gpu_frames = SimpleNamespace(device=torch.device("cpu"), add=None)
    stock = read_all(VideoReader([path], 1, gray=False, capacity=2))
    with captured_log() as lines:
        ours = read_all(VideoReader([path], 1, gray=False, capacity=2, gpu_frames=gpu_frames,
                                    gpu_video=GpuVideo(torch.device("cpu"), nvdec=False, log_skips=log_skips)))
    assert_same_items(ours, stock)
    why = "no CUDA device" if not torch.cuda.is_available() else "codec mpeg4 is not H.264 or HEVC"
    assert lines == ([f"yolo_fastdetect: {path} decodes with cv2, not PyAV: {why}"] if log_skips else [])


@pytest.mark.parametrize(("environment", "expected"), [
    ({}, (False, False)),  # PyAV's planes by default, cv2's reads of other streams not logged
    ({"YOLO_FASTDETECT_PYAV_VIDEO": "1"}, (False, True)),
    ({"YOLO_FASTDETECT_GPU_VIDEO": "1"}, (True, True)),
    ({"YOLO_FASTDETECT_GPU_VIDEO": "1", "YOLO_FASTDETECT_PYAV_VIDEO": "0"}, (True, True)),
    ({"YOLO_FASTDETECT_PYAV_VIDEO": "0"}, None),  # cv2 reads every video, as stock
])
def test_a_gpu_predictors_loader_chooses_its_decoder_once(monkeypatch, tmp_path, environment, expected):
    """The choice is made as the loader is made: a switch changed afterwards does not reach its readers."""
    from yolo_fastdetect.sources import file_loader, gpu_video_choice

    for name in ("YOLO_FASTDETECT_GPU_VIDEO", "YOLO_FASTDETECT_PYAV_VIDEO"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    device = torch.device("cuda", 0)
    choice = gpu_video_choice(device)
    assert (choice if expected is None else (choice.device, choice.nvdec, choice.log_skips)) == (
        None if expected is None else (device, *expected))
    assert gpu_video_choice(None) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_video_choice(device) is None

    clips = [str(write_opencv(tmp_path / f"{index}.avi", 2, 96, 64)) for index in range(2)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("yolo_fastdetect.sources.video_list.Uploads", lambda device, capacity: SimpleNamespace())
    loader = file_loader(clips, batch=2, device=device)
    monkeypatch.setenv("YOLO_FASTDETECT_GPU_VIDEO", "0" if environment.get("YOLO_FASTDETECT_GPU_VIDEO") else "1")
    assert loader._gpu_video == choice
