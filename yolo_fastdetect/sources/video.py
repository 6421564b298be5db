"""Video frames decoded on a background thread, exactly as Ultralytics' ``LoadImagesAndVideos`` reads them.

Stock Ultralytics grabs and retrieves each frame on the predictor's thread, between GPU batches. Here one thread
per loader reads the videos one after another into a bounded queue (the read-ahead), with stock's rules: per frame
``vid_stride`` grabs then one retrieve; a retrieve that fails is skipped without counting; a video ends after its
reported frame count (``CAP_PROP_FRAME_COUNT / vid_stride``) or at the first failed grab; a video that does not open
raises ``FileNotFoundError("Failed to open video ...")`` when the consumer reaches it.

With a :class:`.converted_video.GpuVideo` (a GPU predictor's choice, made as its loader is made) a video whose frames
the GPU converts to cv2's bytes is read that way after cv2 has opened it (stock's errors, frame rate and count):
decoded by PyAV to planes (:mod:`.av_planes`, the default: one 720p stream 1,211 against 803 frames/s through cv2 on
an H100 host, docs/video_design.md) or, with ``YOLO_FASTDETECT_GPU_VIDEO=1``, by NVDEC (:mod:`.nvdec`). Each frame
comes as a host copy (pinned within :mod:`..pinned`'s budget), its BGR tensor held in ``gpu_frames``
(:class:`.upload.Uploads`) for the predictor; where the decoder does not apply cv2 reads the video (one log line says
why, where the user asked for that decoder); where it fails mid-video cv2 reads on from the next frame.
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import torch
from ultralytics.utils import LOGGER

from .. import config
from ..pinned import pinned_array
from .av_planes import PlanesVideo, planes_tags_or_reason
from .converted_video import GpuVideo
from .handoff import drain, get_from, put_unless_stopped
from .nvdec import NvdecLayoutError, NvdecVideo, nvdec_tags_or_reason
from .upload import Upload, Uploads


@dataclass(frozen=True)
class VideoStart:
    """A video opened: its frame rate and frame count after ``vid_stride``, as ``LoadImagesAndVideos._new_video``."""

    fps: float
    frames: int


@dataclass(frozen=True)
class VideoFrame:
    """One decoded frame; ``last`` when it is the video's reported last frame (stock ends the video there); its
    ``upload`` to the GPU, where the reader's upload-ahead or NVDEC made one."""

    image: np.ndarray
    last: bool
    upload: Upload | None = None


VIDEO_END = "end"  # a grab failed: the video ended before its reported frame count (or could not be read on)


def _read_converted(path: str, vid_stride: int, count: int, gpu_frames: Uploads, gpu_video: GpuVideo, decoders: int,
                    frames: queue.Queue, stop: threading.Event) -> bool | int:
    """Read ``path`` by stock's rules from the decoder of ``gpu_video`` (NVDEC with ``decoders`` at once, or PyAV's
    planes), whose frames the GPU converts to cv2's BGR bytes, where that gives cv2's frames. True or False as
    :func:`_read_one` returns; otherwise the number of frames read (0 where the decoder does not apply), from which
    cv2 reads on. Why a decoder does not apply is logged where the user asked for it."""
    decoder = "NVDEC" if gpu_video.nvdec else "PyAV"
    tags = nvdec_tags_or_reason(path) if gpu_video.nvdec else planes_tags_or_reason(path)
    if isinstance(tags, str):
        if gpu_video.log_skips:
            how = "on the CPU, not with NVDEC" if gpu_video.nvdec else "with cv2, not PyAV"
            LOGGER.info(f"yolo_fastdetect: {path} decodes {how}: {tags}")
        return 0
    frame = decoded = 0
    try:
        video = (NvdecVideo(path, gpu_video.device, tags=tags, decoders=decoders) if gpu_video.nvdec
                 else PlanesVideo(path, gpu_video.device, tags=tags))
        with video:
            for converted in video:
                decoded += 1
                if decoded % vid_stride:  # stock grabs vid_stride frames and retrieves the last
                    continue
                with torch.cuda.stream(converted.stream):
                    upload = gpu_frames.add(converted.image, converted.bgr)
                frame += 1
                if not put_unless_stopped(frames, stop, VideoFrame(converted.image, frame == count, upload)):
                    return False
                if frame == count:
                    return True
    except NvdecLayoutError:
        raise  # PyNvVideoCodec changed: an error, not a silent fallback
    except Exception as error:  # noqa: BLE001 - a decoder error: cv2 reads on, as stock reads the file
        LOGGER.warning(f"yolo_fastdetect: {decoder} failed on {path} after {frame} frames ({error}); cv2 reads on")
        return frame
    return put_unless_stopped(frames, stop, VIDEO_END)


def _read_one(path: str, vid_stride: int, gray: bool, upload_ahead: Uploads | None, gpu_frames: Uploads | None,
              gpu_video: GpuVideo | None, decoders: int, frames: queue.Queue, stop: threading.Event) -> bool:
    """Read one video into ``frames``; False when reading should stop (consumer gone, or the video did not open).
    With ``upload_ahead`` each BGR frame after the first is retrieved into pinned memory of the previous frame's size
    (cv2 gives every frame the first one's), so that its copy to the GPU starts from there."""
    capture = cv2.VideoCapture(path)
    try:
        fps = capture.get(cv2.CAP_PROP_FPS)
        if not capture.isOpened():
            put_unless_stopped(frames, stop, FileNotFoundError(f"Failed to open video {path}"))
            return False
        count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT) / vid_stride)
        if not put_unless_stopped(frames, stop, VideoStart(fps, count)):
            return False
        frame = 0
        if gpu_video is not None and gpu_frames is not None and not gray:
            outcome = _read_converted(path, vid_stride, count, gpu_frames, gpu_video, decoders, frames, stop)
            if isinstance(outcome, bool):  # (bool before int: a bool is an int)
                return outcome
            frame = outcome
            if not all(capture.grab() for _ in range(frame * vid_stride)):  # the frames already given
                return put_unless_stopped(frames, stop, VIDEO_END)
        pin = upload_ahead is not None and not gray
        into = None  # the pinned array the next frame is retrieved into
        while True:
            grabbed = False
            for _ in range(vid_stride):
                grabbed = capture.grab()
                if not grabbed:
                    break
            if not grabbed:
                return put_unless_stopped(frames, stop, VIDEO_END)
            retrieved, image = capture.retrieve() if into is None else capture.retrieve(into)
            if retrieved and image is not None:
                if gray:
                    image = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)[..., None]
                upload = upload_ahead.put(image) if upload_ahead is not None else None
                if pin:  # `into` now holds this frame (or had another size: cv2 then made a new array)
                    into = pinned_array(image.shape)
                frame += 1
                if not put_unless_stopped(frames, stop, VideoFrame(image, frame == count, upload)):
                    return False
                if frame == count:
                    return True
    finally:
        capture.release()


def _read_all(paths: Sequence[str], vid_stride: int, gray: bool, upload_ahead: Uploads | None,
              gpu_frames: Uploads | None, gpu_video: GpuVideo | None, decoders: int, frames: queue.Queue,
              stop: threading.Event) -> None:
    try:
        for path in paths:
            if not _read_one(path, vid_stride, gray, upload_ahead, gpu_frames, gpu_video, decoders, frames, stop):
                return
    except BaseException as error:  # noqa: BLE001 - handed to the consumer, which raises it
        put_unless_stopped(frames, stop, error)


def _stop(thread: threading.Thread, stop: threading.Event, frames: queue.Queue) -> None:
    stop.set()
    thread.join()
    drain(frames)


class VideoReader:
    """The frames of ``paths``, in order, decoded ahead on one thread into a queue of at most ``capacity`` items.

    :meth:`get` returns, per video, a :class:`VideoStart`, then its :class:`VideoFrame` items, then
    :data:`VIDEO_END` unless the last frame said ``last``; it raises what the reader raised (a video that did not
    open, a decoder error). The thread and its open capture end at :meth:`close` or garbage collection.
    ``upload_ahead``, when given, uploads each frame cv2 decodes from the reader's thread (:mod:`.upload`),
    retrieved into pinned memory, and the frame carries its upload. With ``gpu_video`` (and ``gpu_frames``, which
    holds their GPU copies) the frames are converted on its device where that gives cv2's frames, decoded by PyAV
    (:class:`.av_planes.PlanesVideo`) or by NVDEC with ``decoders`` decoders on each video at once
    (:class:`.nvdec.NvdecVideo`), as ``gpu_video`` says (see the module docstring).
    """

    def __init__(self, paths: Sequence[str], vid_stride: int, gray: bool, capacity: int,
                 upload_ahead: Uploads | None = None, gpu_frames: Uploads | None = None,
                 gpu_video: GpuVideo | None = None, decoders: int = 1):
        self._frames: queue.Queue = queue.Queue(maxsize=max(1, capacity))
        stop = threading.Event()
        self._thread = threading.Thread(
            target=_read_all, daemon=True, name="yolo_fastdetect_video",
            args=(list(paths), vid_stride, gray, upload_ahead, gpu_frames, gpu_video, decoders, self._frames, stop),
        )
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop, self._thread, stop, self._frames)

    def get(self) -> VideoStart | VideoFrame | str:
        """The next item; raises the reader's error. Never blocks once the reader has ended."""
        item = get_from(self._frames, self._thread,
                        "yolo_fastdetect: the video reader stopped before the end of the videos")
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self) -> None:
        """Stop the reader, join its thread, release its capture (idempotent)."""
        self._finalizer()

# Frames decoded ahead by the readers of videos open at once, at most (each holds a batch and the frame it waits to
# hand over): 72 frames are 0.45 GB at 1080p and 1.8 GB at 4K, and bound host memory however large the batch. 72,
# not 64, so that eight videos at batch 8 (a wall of cameras) all decode at once: with seven open, the eighth opens as
# the others end together and then decodes alone, one stream's rate for a whole video (docs/video_design.md).
VIDEO_FRAMES_AHEAD_MAX = 72


def videos_open_at_once(threads: int, batch: int) -> int:
    """Videos a loader of several videos decodes at once: one per decoder thread, at least two (one decodes while
    another's batch is handed out), no more than keeps :data:`VIDEO_FRAMES_AHEAD_MAX` frames ahead.

    Examples:
        >>> videos_open_at_once(threads=15, batch=8), videos_open_at_once(threads=15, batch=64)
        (8, 2)
    """
    return max(2, min(threads, VIDEO_FRAMES_AHEAD_MAX // (batch + 1)))


def nvdec_decoders(open_videos: int) -> int:
    """NVDEC decoders on each of ``open_videos`` videos decoding at once: ``YOLO_FASTDETECT_NVDEC_DECODERS`` shared
    among them, at least one each (with 4: 4 on one video, 1 each on 3 or 8).

    Examples:
        >>> nvdec_decoders(1), nvdec_decoders(8)  # YOLO_FASTDETECT_NVDEC_DECODERS unset: 1
        (1, 1)
    """
    return max(1, config.get("YOLO_FASTDETECT_NVDEC_DECODERS") // max(1, open_videos))


class VideosInOrder:
    """What ``VideoReader(paths, ...)`` gives, item for item and in the same order, from up to ``open_videos``
    consecutive videos decoding at once, one :class:`VideoReader` each: while one video is handed out, the next ones
    decode on other cores. A video's reader starts when an earlier one is done, and its error (a video that does not
    open) is raised when the consumer reaches that video, as one reader raises it, and stops the readers ahead.

    Examples:
        >>> videos = VideosInOrder(["a.mp4", "b.mp4", "c.mp4"], vid_stride=1, gray=False, capacity=8, open_videos=2)
        >>> start = videos.get()  # a's VideoStart, then its frames; b decodes meanwhile
    """

    def __init__(self, paths: Sequence[str], vid_stride: int, gray: bool, capacity: int, open_videos: int,
                 upload_ahead: Uploads | None = None, gpu_frames: Uploads | None = None,
                 gpu_video: GpuVideo | None = None, decoders: int = 1):
        self._waiting = collections.deque(paths)
        self._open: collections.deque[VideoReader] = collections.deque()
        self._reader = functools.partial(VideoReader, vid_stride=vid_stride, gray=gray, capacity=capacity,
                                         upload_ahead=upload_ahead, gpu_frames=gpu_frames, gpu_video=gpu_video,
                                         decoders=decoders)
        self._open_videos = max(1, open_videos)
        self._open_more()

    def _open_more(self) -> None:
        while self._waiting and len(self._open) < self._open_videos:
            self._open.append(self._reader([self._waiting.popleft()]))

    def get(self) -> VideoStart | VideoFrame | str:
        """The next item of the video being handed out; raises its reader's error."""
        if not self._open:
            raise RuntimeError("yolo_fastdetect: the video reader stopped before the end of the videos")
        try:
            item = self._open[0].get()
        except BaseException:
            self.close()  # the consumer stops here, as at one reader's error: the readers ahead stop too
            raise
        if item is VIDEO_END or (isinstance(item, VideoFrame) and item.last):  # that video is done
            self._open.popleft().close()
            self._open_more()
        return item

    def close(self) -> None:
        """Stop every reader, join their threads, release their captures (idempotent)."""
        self._waiting.clear()
        while self._open:
            self._open.popleft().close()
