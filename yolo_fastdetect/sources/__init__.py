"""Parallel, read-ahead loaders for file sources, decoded exactly as stock Ultralytics decodes them.

:func:`file_loader` returns the loader for what ``model.predict`` calls a file source, or None for what stays
stock (streams, webcams, screenshots, URLs, in-memory images and tensors):

- a path (image, video, folder, glob, ``.txt``/``.csv`` list of paths): :class:`FileLoader`;
- a list or tuple of paths (``str`` or ``Path``): :class:`PathListLoader`; of video paths, :class:`VideoListLoader`
  (every frame of every video, each batch one of stock's batches of one video alone; a list that mixes videos and
  images raises ``ValueError``);
- a ``.streams`` file whose every line is a local video file: :class:`VideoListLoader`, every frame of each video as
  stock predicts it alone (stock's ``LoadStreams`` drops frames of files); one with any live entry (webcam, URL,
  RTSP) stays stock's, with its latest-frame semantics.

Each loader's batches are stock's ``(paths, im0s, info)``, ``im0s`` an :class:`ImageBatch` (:mod:`.batch`): the list
of images, with their uploads to the GPU and stock's letterbox geometry, which the patched ``preprocess`` asks.

Settings (environment variables, read when a loader is made):

- ``YOLO_FASTDETECT_SOURCES=0``: Ultralytics' own loaders;
- ``YOLO_FASTDETECT_DECODE_THREADS``: decoder threads (default: the CPU cores this process may use, less one);
- ``YOLO_FASTDETECT_READ_AHEAD``: batches decoded ahead of the predictor (default 2);
- ``YOLO_FASTDETECT_LIST_OPENCV=0``: every file of a list decodes through Pillow, as stock (by default OpenCV decodes
  the JPEGs it decodes to the same bytes, see :mod:`.path_list`);
- ``YOLO_FASTDETECT_UPLOAD_AHEAD=0``: at batch 1 too, the predictor's thread uploads each image to the GPU (by
  default the decoder threads do, see :mod:`.upload`);
- ``YOLO_FASTDETECT_GPU_JPEG=1`` (opt-in; not stock's pixels): a folder's, glob's or ``.txt``/``.csv`` list's baseline
  JPEGs decode on the GPU with nvJPEG (:mod:`.gpu_jpeg`); Python lists of paths keep the CPU;
- ``YOLO_FASTDETECT_GPU_VIDEO=1`` (opt-in: slower than the CPU decode on the benchmark's clips, RESULTS' Video): H.264
  and HEVC videos decode on the GPU with NVDEC where that gives cv2's frames (:mod:`.nvdec`; needs the ``[video]``
  extra).
"""

from __future__ import annotations

import os
from codecs import BOM_UTF8
from io import TextIOWrapper
from pathlib import Path

import torch
from ultralytics.data.utils import VID_FORMATS

from .. import config
from .batch import ImageBatch
from .converted_video import GpuVideo
from .files import FileLoader
from .path_list import PathListLoader
from .prefetch import OrderedPrefetch
from .upload import Uploads
from .video import VideoReader, videos_open_at_once
from .video_list import VideoListLoader, is_video_list

__all__ = ["FileLoader", "ImageBatch", "OrderedPrefetch", "PathListLoader", "Uploads", "VideoListLoader",
           "VideoReader", "decode_threads", "file_loader", "read_ahead"]

SOURCES_VARIABLE = "YOLO_FASTDETECT_SOURCES"
THREADS_VARIABLE = "YOLO_FASTDETECT_DECODE_THREADS"
READ_AHEAD_VARIABLE = "YOLO_FASTDETECT_READ_AHEAD"
LIST_OPENCV_VARIABLE = "YOLO_FASTDETECT_LIST_OPENCV"
UPLOAD_AHEAD_VARIABLE = "YOLO_FASTDETECT_UPLOAD_AHEAD"
GPU_JPEG_VARIABLE = "YOLO_FASTDETECT_GPU_JPEG"
GPU_VIDEO_VARIABLE = "YOLO_FASTDETECT_GPU_VIDEO"
PYAV_VIDEO_VARIABLE = "YOLO_FASTDETECT_PYAV_VIDEO"
DECODER_NICE_VARIABLE = "YOLO_FASTDETECT_DECODER_NICE"
# Upload-ahead pays where the predictor's thread bounds the pipeline (batch 1, a folder or a video; several videos
# decoding at once, each on a reader of its own), and costs where the decoders do, since they take on the copies
# (larger batches of files; one video at batch 8, which its one reader thread bounds). So batch 1, and any batch of a
# list of several videos read in turn (see benchmarks/RESULTS.md, File sources and Video; docs/sources_design.md).
UPLOAD_AHEAD_MAX_BATCH = 1

# What check_source treats as a stream, a URL or a screenshot rather than a local file.
_STREAM_PREFIXES = ("rtsp://", "rtmp://", "tcp://", "http://", "https://")


def decode_threads() -> int:
    """Decoder threads: ``YOLO_FASTDETECT_DECODE_THREADS``, else the cores this process may run on, less one (the
    predictor's thread), at least one."""
    return config.get(THREADS_VARIABLE)


def read_ahead() -> int:
    """Batches decoded ahead of the predictor: ``YOLO_FASTDETECT_READ_AHEAD``, default 2."""
    return config.get(READ_AHEAD_VARIABLE)


def _is_local_path(source: object) -> bool:
    """Whether ``check_source`` would send ``source`` to ``LoadImagesAndVideos`` (not a webcam, stream, URL or
    screenshot)."""
    if isinstance(source, Path):
        return True
    if not isinstance(source, str):
        return False
    lower = source.lower()
    screenshot = lower == "screen" or (lower.startswith("screen ") and not Path(source).exists())
    return not (source.isnumeric() or lower.endswith(".streams") or lower.startswith(_STREAM_PREFIXES) or screenshot)


def local_video_streams(source: object) -> list[str] | None:
    """The lines of a ``.streams`` file, read as stock's ``LoadStreams`` reads them, where every one is an existing
    local video file (by suffix, as stock sorts a folder's files); None for any other source, and for a ``.streams``
    file with a webcam index, a URL, a stream, a missing file or an empty list (stock's loader then reads it, or
    raises its error).

    Examples:
        >>> local_video_streams("cameras.streams")  # lines "a.mp4" and "b.avi", both files here  # doctest: +SKIP
        ['a.mp4', 'b.avi']
    """
    if not isinstance(source, (str, Path)) or not str(source).lower().endswith(".streams"):
        return None
    if not os.path.isfile(source):
        return None
    with open(source, "rb") as file:
        encoding = "utf-8-sig" if file.peek(3).startswith(BOM_UTF8) else None  # as LoadStreams
        with TextIOWrapper(file, encoding=encoding) as reader:
            lines = reader.read().rsplit()
    local = all(_is_local_path(line) and line.rpartition(".")[-1].lower() in VID_FORMATS and os.path.isfile(line)
                for line in lines)
    return lines if lines and local else None


def gpu_video_choice(device: torch.device | None) -> GpuVideo | None:
    """How a GPU predictor's loader reads its videos, chosen once as it is made: converted on ``device`` (where a GPU
    is here), decoded by NVDEC with ``YOLO_FASTDETECT_GPU_VIDEO=1``, else by PyAV to planes unless
    ``YOLO_FASTDETECT_PYAV_VIDEO=0``; a video cv2 reads instead is logged where the user set the decoder's switch.
    None: cv2 reads the videos.

    Examples:
        >>> gpu_video_choice(None) is None  # a CPU predictor: cv2 reads, as stock
        True
    """
    nvdec = config.get(GPU_VIDEO_VARIABLE)
    if device is None or not (nvdec or config.get(PYAV_VIDEO_VARIABLE)) or not torch.cuda.is_available():
        return None
    return GpuVideo(device, nvdec, log_skips=nvdec or config.is_set(PYAV_VIDEO_VARIABLE))


def file_loader(source, batch: int = 1, vid_stride: int = 1, channels: int = 3, device: torch.device | None = None,
                tracking: bool = False) -> FileLoader | PathListLoader | VideoListLoader | None:
    """The parallel loader for ``source``, or None where Ultralytics' own loader stays (not a file source, or
    ``YOLO_FASTDETECT_SOURCES=0``). Raises what stock raises for a missing path. ``device``: the CUDA device where the
    predictor letterboxes, if it does: the decoder threads then run below the predictor's priority (Linux, see
    :mod:`.prefetch`; not with ``YOLO_FASTDETECT_DECODER_NICE=0``) and upload the images there at batch 1 and for a
    list of several videos (unless ``YOLO_FASTDETECT_UPLOAD_AHEAD=0``), with ``YOLO_FASTDETECT_GPU_JPEG=1`` a file
    source's JPEGs decode there, and with ``YOLO_FASTDETECT_GPU_VIDEO=1`` its videos (NVDEC, where exact).
    ``tracking``: for ``model.track``, a list of videos is handed out one video at a time.

    Examples:
        >>> loader = file_loader("path/to/folder", batch=16)
        >>> file_loader(0) is None  # a webcam stays stock
        True
    """
    if not config.get(SOURCES_VARIABLE):
        return None
    path_list = isinstance(source, (list, tuple)) and bool(source) and all(
        isinstance(item, Path) or (isinstance(item, str) and not item.lower().startswith(("http://", "https://")))
        for item in source
    )
    streams = local_video_streams(source)
    video_list = streams is not None or (path_list and is_video_list(source))
    if path_list and not video_list:
        # Stock predicts a list of images as one batch, whatever `batch` says; the batch's size decides cuDNN's
        # algorithms, whose rounding (TF32, fp16) shows in the boxes, so the loader's one batch is the list too.
        batch = len(source)
    # A tracker takes one video at a time: its one reader bounds the pipeline then, as for a single video.
    several_videos = video_list and not tracking and len(streams or source) > 1
    upload = (batch <= UPLOAD_AHEAD_MAX_BATCH or several_videos) and config.get(UPLOAD_AHEAD_VARIABLE)
    nice = device is not None and config.get(DECODER_NICE_VARIABLE)
    options = {"batch": batch, "channels": channels, "threads": decode_threads(), "read_ahead": read_ahead(),
               "upload_to": device if upload else None, "lower_priority": nice}
    gpu_video = gpu_video_choice(device)
    if streams is None and _is_local_path(source):
        gpu_jpeg = device if config.get(GPU_JPEG_VARIABLE) else None
        return FileLoader(source, vid_stride=vid_stride, gpu_jpeg=gpu_jpeg, gpu_video=gpu_video, **options)
    if video_list:
        open_videos = videos_open_at_once(options["threads"], batch)  # each reader one thread, a batch ahead
        return VideoListLoader(streams or source, batch, vid_stride, channels, open_videos=open_videos,
                               upload_to=options["upload_to"], gpu_video=gpu_video, interleave=not tracking)
    if path_list:
        return PathListLoader(source, opencv_jpeg=config.get(LIST_OPENCV_VARIABLE), **options)
    return None
