"""A list of video files: every frame of every video, each batch one of stock's batches of one video alone.

Stock Ultralytics opens every entry of a Python list as an image (``autocast_list``), so a list of videos fails there
(a video is no image: ``UnidentifiedImageError``, or offline ``ModuleNotFoundError: pi_heif``), and its ``.streams``
loader drops frames of files. :class:`VideoListLoader` reads each video with :class:`.VideoReader` (stock's frame
rules: ``vid_stride`` grabs then one retrieve, the reported frame count) and :func:`.file_loader` gives it a Python
list of videos and a ``.streams`` file whose every line is a local video file.

Batches: each batch is exactly one of the batches stock gives when it predicts that video alone with the same
``batch`` and ``vid_stride``: ``batch`` consecutive frames of one video, its last batch the remainder. A batch never
mixes videos, because on a GPU cuDNN picks its convolution algorithm (and with it the TF32 / fp16 summation order)
per problem, the batch size included: a frame run in a batch of another size than stock's can gain or lose a box at
the threshold. Each frame's path is its video's absolute path (as stock names a video), its ``info`` string stock's
``video i/n (frame f/F) path: `` (``i`` the video's place in the list), and the loader's ``frame``, ``frames`` and
``fps`` are those of the batch's video as the batch is returned (a saved video takes its own frame rate).

Order: up to ``open_videos`` videos are open at once, in list order, and batches are handed out round-robin across
them (video 1's first batch, video 2's first batch, ..., then the second batches); a video that ends gives its place
in the round to the next video of the list. Each video's frames thus come in order, and the first results before the
last video is opened. With ``interleave=False`` (``model.track``: Ultralytics' tracker follows one video and resets
when the path changes) each video is handed out whole before the next, the next ones decoding meanwhile.

Decoding: one :class:`.VideoReader` thread per open video, each holding at most a batch of frames ahead (and the one
it waits to hand over), so memory is bounded by ``open_videos x (batch + 1)`` frames plus the batches in the
predictor's hands (:func:`frames_in_flight`, which also sizes the uploads). While one video's batch is predicted
the other open videos' readers decode theirs, so several cores decode at once; :func:`.file_loader` opens as many
videos as there are decoder threads (``YOLO_FASTDETECT_DECODE_THREADS``, the cores less one), at least two, and no
more than keep 72 frames ahead (:func:`.video.videos_open_at_once`).

Bad input: a missing path raises stock's ``FileNotFoundError("... does not exist")``, and an empty (0-byte) file
stock's ``FileNotFoundError("Failed to open video ...")``, both before any frame. A video that does not open (cut
before its index, not a video) is left out while the others go on, and after their last frame one
``FileNotFoundError`` names every such file. A video cut mid-stream ends at its last readable frame, as in stock; a
video without frames gives none.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import torch
from ultralytics.data.loaders import LoadImagesAndVideos, SourceTypes
from ultralytics.data.utils import IMG_FORMATS, VID_FORMATS

from .batch import ImageBatch
from .converted_video import GpuVideo
from .upload import Uploads
from .video import VIDEO_END, VideoReader, VideoStart, nvdec_decoders


def _suffix(path: str | Path) -> str:
    return os.fspath(path).rpartition(".")[-1].lower()


def is_video_list(paths: Sequence[str | Path]) -> bool:
    """Whether a list of paths is all videos (by suffix, as stock sorts a folder's files); raises ``ValueError`` for
    a list that mixes videos with other files, which stock cannot read either.

    Examples:
        >>> is_video_list(["a.mp4", "b.avi"]), is_video_list(["a.jpg"])
        (True, False)
    """
    videos = [p for p in paths if _suffix(p) in VID_FORMATS]
    if not videos:
        return False
    others = [p for p in paths if _suffix(p) not in VID_FORMATS]
    if others:
        kinds = "images" if all(_suffix(p) in IMG_FORMATS for p in others) else "other files"
        raise ValueError(f"yolo_fastdetect: a list of paths mixes videos ({os.fspath(videos[0])}, ...) with {kinds} "
                         f"({os.fspath(others[0])}, ...); predict the videos and the images as two lists")
    return True


def frames_in_flight(open_videos: int, batch: int) -> int:
    """Frames a :class:`VideoListLoader` holds decoded at most, hence uploads ahead at most: per open video a batch in
    its reader's queue and the frame the reader waits to hand over; the batch being gathered (or gathered, waiting in
    stock's prefetch thread); and the batch in the predictor's hands.

    Examples:
        >>> frames_in_flight(open_videos=4, batch=8)
        52
    """
    return open_videos * (batch + 1) + 2 * batch


@dataclass
class _OpenVideo:
    """An open video: its place in the list, its reader, and stock's counters."""

    index: int
    reader: VideoReader
    started: bool = False
    ended: bool = False
    fps: float = 0.0
    frames: int = 0
    frame: int = 0


class VideoListLoader(LoadImagesAndVideos):
    """Batches of frames from a list of videos, each batch one of stock's batches of one video alone, handed out
    round-robin across the open videos (see the module docstring), decoded ahead on one thread per open video.

    Args:
        paths (Sequence[str | Path]): Video files, in the order to read them.
        batch (int): Batch size, as stock's for one video.
        vid_stride (int): Video frame-rate stride.
        channels (int): Image channels of the model (1 grayscale, 3 BGR).
        open_videos (int): Videos open (and decoding) at once.
        upload_to (torch.device | None): A CUDA device the reader threads upload the frames to (:mod:`.upload`).
        gpu_video (GpuVideo | None): Where and with which decoder the GPU converts the videos' frames where that
            gives cv2's (PyAV's planes, or NVDEC's: as :class:`.files.FileLoader`); their copies ride in
            :attr:`uploads`.
        interleave (bool): Hand out the open videos' batches in turn; False for a tracker, which follows one video
            at a time: each video whole, in list order.

    Examples:
        >>> for paths, images, info in VideoListLoader(["a.mp4", "b.mp4"], batch=8, open_videos=2):
        ...     pass
    """

    def __init__(self, paths: Sequence[str | Path], batch: int = 1, vid_stride: int = 1, channels: int = 3,
                 open_videos: int = 2, upload_to: torch.device | None = None, gpu_video: GpuVideo | None = None,
                 interleave: bool = True):
        # LoadImagesAndVideos.__init__ is not called: it sorts a list and opens its first video.
        files = []
        for p in paths:
            path = str(Path(p).absolute())  # stock's name for a file source, not resolved
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{p} does not exist")
            if os.path.getsize(path) == 0:
                raise FileNotFoundError(f"Failed to open video {path}")
            files.append(path)
        self.files, self.nf, self.ni, self.video_flag = files, len(files), 0, [True] * len(files)
        self.mode, self.vid_stride, self.bs = "video", vid_stride, batch
        self.open_videos, self.interleave = max(1, open_videos), interleave
        self.cv2_flag = {1: cv2.IMREAD_GRAYSCALE, 3: cv2.IMREAD_COLOR}.get(channels, cv2.IMREAD_UNCHANGED)
        self.cap, self.frame, self.frames, self.fps, self.count = None, 0, 0, 0.0, 0
        self.source_type = SourceTypes()  # frames carry their index in ``info``, as a file source's do
        device = upload_to or (gpu_video.device if gpu_video is not None else None)
        in_flight = frames_in_flight(min(self.open_videos, self.nf), batch)
        self.uploads = Uploads(device, in_flight) if device is not None else None
        self._upload_ahead, self._gpu_video = upload_to is not None, gpu_video
        self._slots: list[_OpenVideo | None] = []  # the open videos, in their order of the round
        self._turn = 0  # the slot whose batch comes next
        self._next_index = 0  # the next video of the list to open
        self._failed: list[str] = []

    def __iter__(self) -> VideoListLoader:
        self.close()
        self.count, self._turn, self._next_index = 0, 0, 0
        self._slots = [self._open_next() for _ in range(min(self.open_videos, self.nf))]
        return self

    def _open_next(self) -> _OpenVideo | None:
        """Start a reader for the next video of the list (None when none is left); it decodes a batch ahead."""
        if self._next_index >= self.nf:
            return None
        reader = VideoReader([self.files[self._next_index]], self.vid_stride, self.cv2_flag == cv2.IMREAD_GRAYSCALE,
                             self.bs, upload_ahead=self.uploads if self._upload_ahead else None,
                             gpu_frames=self.uploads if self._gpu_video is not None else None,
                             gpu_video=self._gpu_video, decoders=nvdec_decoders(min(self.open_videos, self.nf)))
        self._next_index += 1
        return _OpenVideo(self._next_index - 1, reader)

    def __next__(self) -> tuple[list[str], ImageBatch, list[str]]:
        while any(video is not None for video in self._slots):
            slot = self._turn
            video = self._slots[slot]
            batch = self._read_batch(video) if video is not None else None
            if video is None or video.ended:
                self._slots[slot] = self._open_next() if video is not None else None
            if self.interleave or video is None or video.ended:
                self._turn = (slot + 1) % len(self._slots)
            if batch:
                return batch
        # Every reader has ended. The uploads stay: the last batch's may not be taken yet (stock's prefetch thread
        # asks for the next batch while the predictor letterboxes this one); close() drops them.
        failed, self._failed = self._failed, []
        if failed:
            raise FileNotFoundError(f"Failed to open video{'s' if len(failed) > 1 else ''} {', '.join(failed)}")
        raise StopIteration

    def _read_batch(self, video: _OpenVideo) -> tuple[list[str], ImageBatch, list[str]] | None:
        """The video's next batch, as stock's: up to ``batch`` frames, fewer where the video ends (then its reader is
        released); None where it gives no frame (it ended, had none, or did not open: noted for the error at the
        end)."""
        path = self.files[video.index]
        if not video.started:
            video.started = True
            try:
                start: VideoStart = video.reader.get()
            except FileNotFoundError:
                self._failed.append(path)
                video.ended = True
                return None
            video.fps, video.frames = start.fps, start.frames
        paths, images, info, uploads = [], [], [], []
        while len(images) < self.bs:
            item = video.reader.get()
            if item is VIDEO_END:
                video.ended = True
                break
            video.frame += 1
            paths.append(path)
            images.append(item.image)
            uploads.append(item.upload)
            info.append(f"video {video.index + 1}/{self.nf} (frame {video.frame}/{video.frames}) {path}: ")
            if item.last:
                video.ended = True
                break
        if video.ended:
            video.reader.close()
            self.count += 1
        if not images:
            return None
        self.frame, self.frames, self.fps = video.frame, video.frames, video.fps
        return paths, ImageBatch(images, uploads), info

    def close(self) -> None:
        """Stop the reader threads, release the videos and drop the uploads not taken (idempotent; the predictor
        calls it when it stops)."""
        for video in self._slots:
            if video is not None:
                video.reader.close()
        self._slots, self._failed = [], []
        if self.uploads is not None:
            self.uploads.clear()
