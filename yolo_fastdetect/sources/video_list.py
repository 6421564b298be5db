"""A Python list (or tuple) of video paths: every frame of every video, batched across the videos.

Stock Ultralytics opens every entry of a list as an image (``autocast_list``), so a list of videos fails there (a
video is no image: ``UnidentifiedImageError``, or offline ``ModuleNotFoundError: pi_heif``), and its ``.streams``
loader drops frames of files. :class:`VideoListLoader` reads each video with :class:`.VideoReader` (stock's frame
rules: ``vid_stride`` grabs then one retrieve, the reported frame count) and batches across the videos.

Order: the videos fill ``batch`` slots in list order, and a video that ends frees its slot for the next video of
the list. A batch holds the next frame of each slot's video, in slot order, that share one frame size (so that each
frame is letterboxed exactly as stock letterboxes its video alone) and one frame rate (the loader's ``fps``, which a
saved video takes): those of the slot whose turn it is. The turn starts at the first slot and passes, after each
batch, to the next slot (in slot order, going round) that the batch left out. Videos of one size and rate thus
advance together, a frame each per batch, and the other sizes and rates take turns with them. At batch 1 that is
video after video, as stock reads a folder. Each frame's path is its video's absolute path (as stock names a video)
and its ``info`` string is stock's ``video i/n (frame f/F) path: ``, ``i`` the video's place in the list; the
loader's ``frame`` and ``frames`` are those of the batch's last frame (each frame's own are in its ``info``).

Decoding: one :class:`.VideoReader` thread per open video, each at most ``read_ahead`` frames ahead, and the
``read_ahead`` next videos opened ahead of their slots; so at most ``batch + read_ahead`` videos are open at once and
the first batch comes before the last video is opened.

Tracking (``model.track``) reads the videos one at a time, a frame per batch: Ultralytics' tracker follows one video
and resets when the path changes, so interleaved videos would reset it at every frame.

Bad input: a missing path raises stock's ``FileNotFoundError("... does not exist")``, and an empty (0-byte) file
stock's ``FileNotFoundError("Failed to open video ...")``, both before any frame. A video that does not open (cut
before its index, not a video) is left out while the others go on, and after their last frame one
``FileNotFoundError`` names every such file. A video cut mid-stream ends at its last readable frame, as in stock.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import torch
from ultralytics.data.loaders import LoadImagesAndVideos, SourceTypes
from ultralytics.data.utils import IMG_FORMATS, VID_FORMATS

from .batch import ImageBatch
from .upload import Uploads
from .video import VIDEO_END, VideoFrame, VideoReader, VideoStart


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


@dataclass
class _OpenVideo:
    """A video in a slot: its place in the list, reader, stock's counters and its next frame, read ahead of the batch
    that takes it (its size picks the batch)."""

    index: int
    reader: VideoReader
    fps: float = 0.0
    frames: int = 0
    frame: int = 0
    next: VideoFrame | None = None


class VideoListLoader(LoadImagesAndVideos):
    """Batches of frames from a list of videos, one frame of each of up to ``batch`` videos per batch (see the module
    docstring for the order), decoded ahead on one thread per open video.

    Args:
        paths (Sequence[str | Path]): Video files, in the order to read them.
        batch (int): Batch size: videos read side by side.
        vid_stride (int): Video frame-rate stride.
        channels (int): Image channels of the model (1 grayscale, 3 BGR).
        read_ahead (int): Frames decoded ahead per video, and videos opened ahead of their slots.
        upload_to (torch.device | None): A CUDA device the reader threads upload the frames to (:mod:`.upload`).
        gpu_video (torch.device | None): A CUDA device to decode the videos on with NVDEC where that gives cv2's
            frames (:mod:`.nvdec`; their copies ride in :attr:`uploads`), or None.
        side_by_side (int | None): Videos read side by side (slots), default ``batch``; 1 for a tracker, which
            follows one video at a time (Ultralytics resets it when the path changes).

    Examples:
        >>> for paths, images, info in VideoListLoader(["a.mp4", "b.mp4"], batch=2):
        ...     pass
    """

    def __init__(self, paths: Sequence[str | Path], batch: int = 1, vid_stride: int = 1, channels: int = 3,
                 read_ahead: int = 2, upload_to: torch.device | None = None, side_by_side: int | None = None,
                 gpu_video: torch.device | None = None):
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
        self.mode, self.vid_stride, self.bs, self.read_ahead = "video", vid_stride, batch, read_ahead
        self.side_by_side = side_by_side or batch
        self.cv2_flag = {1: cv2.IMREAD_GRAYSCALE, 3: cv2.IMREAD_COLOR}.get(channels, cv2.IMREAD_UNCHANGED)
        self.cap, self.frame, self.frames, self.fps, self.count = None, 0, 0, 0.0, 0
        self.source_type = SourceTypes()  # frames carry their index in ``info``, as a file source's do
        # Frames uploaded ahead at most: per open video its queue, the frame its reader holds while it waits for room
        # and the frame read ahead; and the predictor's batches.
        in_flight = (self.side_by_side + read_ahead) * (read_ahead + 3) + 2 * batch
        device = upload_to or gpu_video
        self.uploads = Uploads(device, in_flight) if device is not None else None
        self._upload_ahead, self._gpu_video = upload_to is not None, gpu_video is not None
        self._slots: list[_OpenVideo | None] = []
        self._ahead: deque[_OpenVideo] = deque()
        self._next_index = 0
        self._turn = 0
        self._failed: list[str] = []

    def __iter__(self) -> VideoListLoader:
        self.close()
        self.count = 0
        self._slots = [None] * min(self.side_by_side, self.nf)
        self._next_index, self._turn = 0, 0
        self._failed = []
        self._open_ahead()
        return self

    def _open_ahead(self) -> None:
        """Start readers for the next videos, up to ``read_ahead`` beyond the slots."""
        while len(self._ahead) < self.read_ahead and self._next_index < self.nf:
            gray = self.cv2_flag == cv2.IMREAD_GRAYSCALE
            reader = VideoReader([self.files[self._next_index]], self.vid_stride, gray, self.read_ahead + 1,
                                 on_frame=self.uploads.put if self._upload_ahead else None,
                                 gpu_frames=self.uploads if self._gpu_video else None)
            self._ahead.append(_OpenVideo(self._next_index, reader))
            self._next_index += 1

    def _next_video(self) -> _OpenVideo | None:
        """The next video that opens and has a frame, its counters and first frame set; None when none is left. One
        that does not open is noted; one without a frame counts as read."""
        while self._ahead:
            video = self._ahead.popleft()
            self._open_ahead()
            try:
                start: VideoStart = video.reader.get()
            except FileNotFoundError:
                self._failed.append(self.files[video.index])
                continue
            video.fps, video.frames = start.fps, start.frames
            if self._advance(video):
                return video
        return None

    def _advance(self, video: _OpenVideo) -> bool:
        """Read ``video``'s next frame into ``video.next``; False (and the video released) when it has ended."""
        item = video.reader.get() if video.next is None or not video.next.last else VIDEO_END
        if item is VIDEO_END:
            video.reader.close()
            self.count += 1
            return False
        video.next = item
        return True

    def __next__(self) -> tuple[list[str], ImageBatch, list[str]]:
        for slot, video in enumerate(self._slots):
            if video is None:
                self._slots[slot] = self._next_video()
        open_slots = [slot for slot, video in enumerate(self._slots) if video is not None]
        if not open_slots:
            failed = self._failed
            self.close()
            if failed:
                raise FileNotFoundError(f"Failed to open video{'s' if len(failed) > 1 else ''} {', '.join(failed)}")
            raise StopIteration
        turn = next((slot for slot in open_slots if slot >= self._turn), open_slots[0])
        group = self._group(self._slots[turn])
        taken = [slot for slot in open_slots if self._group(self._slots[slot]) == group]
        others = [slot for slot in open_slots if slot not in taken]  # the turn passes to the next one of these
        self._turn = next((slot for slot in others if slot > turn), others[0] if others else turn)
        paths, images, info, uploads = [], [], [], []
        for slot in taken:
            video = self._slots[slot]
            video.frame += 1
            path = self.files[video.index]
            paths.append(path)
            images.append(video.next.image)
            uploads.append(video.next.upload)
            info.append(f"video {video.index + 1}/{self.nf} (frame {video.frame}/{video.frames}) {path}: ")
            self.frame, self.frames, self.fps = video.frame, video.frames, video.fps
            if not self._advance(video):
                self._slots[slot] = None
        return paths, ImageBatch(images, uploads), info

    @staticmethod
    def _group(video: _OpenVideo) -> tuple:
        """What the frames of one batch share: their size (the letterbox) and their video's frame rate (``fps``, which
        a saved video takes)."""
        return video.next.image.shape, video.fps

    def close(self) -> None:
        """Stop the reader threads and release the videos (idempotent; the predictor calls it when it stops)."""
        for video in [*self._slots, *self._ahead]:
            if video is not None:
                video.reader.close()
        self._slots, self._ahead, self._failed = [], deque(), []
        if self.uploads is not None:
            self.uploads.clear()
