"""Stock's rules for reading a video with ``cv2.VideoCapture``, and the decoder process that runs them.

Ultralytics' ``LoadImagesAndVideos`` reads a frame as ``vid_stride`` grabs then one retrieve; a retrieve that fails
is skipped without counting; the video ends after its reported frame count (``CAP_PROP_FRAME_COUNT / vid_stride``)
or at the first failed grab. :func:`stock_frames` is that loop, shared by the reader thread (:mod:`.video`) and the
decoder process (:mod:`.video_process`), which runs this file as a script: it imports only cv2 and numpy, so that it
starts in a fraction of a second.

The process's side of :mod:`.video_process`'s protocol (``python stock_video.py PATH VID_STRIDE SLOTS FD``):

- stdout: a JSON line ``{"opened": bool, "fps": float, "frames": int}``, then fixed-size records (:data:`RECORD`:
  a kind byte and four integers): ``S h w c n`` once, before the first frame (the memfd ``FD`` now holds ``n``
  slots of frames of that shape), ``F slot`` (a frame in that slot: the parent holds the slot until it gives it
  back), ``I h w c`` followed by the frame's bytes (every slot held, or a frame of another shape), ``E`` (the video
  ended: after its last frame or at a failed grab), ``X n`` followed by an n-byte UTF-8 error message;
- stdin: the slots the parent gives back, two bytes each (little-endian); its end closed: stop.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np

if TYPE_CHECKING:
    from .upload import Upload

@dataclass(frozen=True)
class VideoStart:
    """A video opened: its frame rate and frame count after ``vid_stride``, as ``LoadImagesAndVideos._new_video``."""

    fps: float
    frames: int


@dataclass(frozen=True)
class VideoFrame:
    """One decoded frame; ``last`` when it is the video's reported last frame (stock ends the video there); its
    ``upload`` to the GPU, where the reader's ``on_frame`` or NVDEC made one."""

    image: np.ndarray
    last: bool
    upload: Upload | None = None


VIDEO_END = "end"  # a grab failed: the video ended before its reported frame count (or could not be read on)

# A record of the protocol: kind, then four unsigned 32-bit integers.
RECORD = struct.Struct("<cIIII")
SLOT = struct.Struct("<H")
# Shared frames of one decoder process at most: 40 frames of 4K, the ring of frames that decode ahead and that the
# predictor and its results hold; past it frames come through the pipe.
SHARED_BYTES_MAX = 1 << 30


def stock_start(capture: cv2.VideoCapture, vid_stride: int) -> VideoStart | None:
    """The :class:`VideoStart` of a capture just made, as ``LoadImagesAndVideos._new_video`` reads it; None where it
    did not open (stock then raises ``FileNotFoundError("Failed to open video ...")``)."""
    fps = capture.get(cv2.CAP_PROP_FPS)
    if not capture.isOpened():
        return None
    return VideoStart(fps, int(capture.get(cv2.CAP_PROP_FRAME_COUNT) / vid_stride))


def stock_frames(capture: cv2.VideoCapture, vid_stride: int, count: int, start: int = 0,
                 retrieve: Callable[[cv2.VideoCapture], tuple[bool, np.ndarray | None]] | None = None
                 ) -> Iterator[np.ndarray]:
    """The frames stock reads from the opened ``capture`` after the ``start`` frames already read: up to ``count``
    in all (as ``LoadImagesAndVideos``: a ``count`` of 0 reads to the first failed grab). ``retrieve(capture)``
    replaces ``capture.retrieve()`` (the decoder process retrieves into its shared memory).

    Examples:
        >>> capture = cv2.VideoCapture("clip.mp4")  # doctest: +SKIP
        >>> count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT) / 2)  # doctest: +SKIP
        >>> frames = list(stock_frames(capture, vid_stride=2, count=count))  # doctest: +SKIP
    """
    frame = start
    while frame != count:
        for _ in range(vid_stride):
            if not capture.grab():
                return
        retrieved, image = capture.retrieve() if retrieve is None else retrieve(capture)
        if retrieved and image is not None:
            frame += 1
            yield image


class _Slots:
    """The process's shared frames: up to ``slots`` frames of the first frame's shape in the memfd ``fd``, no more
    than :data:`SHARED_BYTES_MAX` in all. The parent holds a slot while its frame is referenced (a ``Results`` keeps
    it) and gives it back on stdin; the most recently returned slot is filled first, so that pages of the others
    stay untouched where few frames are in flight."""

    def __init__(self, fd: int, slots: int, shape: tuple[int, ...]):
        frame_bytes = int(np.prod(shape))
        self.count = max(2, min(slots, SHARED_BYTES_MAX // frame_bytes))
        os.ftruncate(fd, self.count * frame_bytes)
        self.frames = np.ndarray((self.count, *shape), np.uint8, mmap.mmap(fd, 0))
        self.free = list(range(self.count - 1, -1, -1))  # a stack: the last one is used next
        self.claimed: int | None = None  # the slot the next retrieve writes into
        self._returns = sys.stdin.fileno()
        os.set_blocking(self._returns, False)
        self._partial = b""

    def claim(self) -> int | None:
        """A free slot for the next frame (the one claimed before, if no frame took it), or None where the parent
        holds every slot."""
        if self.claimed is None:
            self._collect_returns()
            self.claimed = self.free.pop() if self.free else None
        return self.claimed

    def _collect_returns(self) -> None:
        try:
            returned = self._partial + os.read(self._returns, 1 << 16)
        except BlockingIOError:
            return
        if len(returned) == len(self._partial):
            raise EOFError("the parent closed its end")
        whole = len(returned) - len(returned) % SLOT.size
        self.free.extend(slot for (slot,) in SLOT.iter_unpack(returned[:whole]))
        self._partial = returned[whole:]


def _decode(path: str, vid_stride: int, slots: int, fd: int, out) -> None:
    capture = cv2.VideoCapture(path)
    start = stock_start(capture, vid_stride)
    header = {"opened": False} if start is None else {"opened": True, "fps": start.fps, "frames": start.frames}
    out.write(json.dumps(header).encode() + b"\n")
    out.flush()
    if start is None:
        return
    shared: _Slots | None = None

    def retrieve(capture: cv2.VideoCapture) -> tuple[bool, np.ndarray | None]:
        slot = shared.claim() if shared is not None else None
        if slot is None:
            return capture.retrieve()
        return capture.retrieve(shared.frames[slot])  # in place where the shape matches

    for image in stock_frames(capture, vid_stride, start.frames, retrieve=retrieve):
        if shared is None and image.dtype == np.uint8:
            shared = _Slots(fd, slots, image.shape)
            out.write(RECORD.pack(b"S", *image.shape, *(0,) * (3 - image.ndim), shared.count))
            shared.frames[shared.claim()] = image
            image = shared.frames[shared.claimed]
        if shared is not None and shared.claimed is not None and np.shares_memory(image, shared.frames[shared.claimed]):
            out.write(RECORD.pack(b"F", shared.claimed, 0, 0, 0))
            shared.claimed = None
        else:  # every slot held, or another shape than the first frame's: sent whole (the pipe holds it back)
            image = np.ascontiguousarray(image)
            out.write(RECORD.pack(b"I", *image.shape, *(0,) * (3 - image.ndim), 0))
            out.write(image.data)
        out.flush()
    out.write(RECORD.pack(b"E", 0, 0, 0, 0))
    out.flush()


def main(argv: list[str]) -> None:
    """The decoder process: decode ``argv = [path, vid_stride, slots, fd]`` by stock's rules (see the module)."""
    path, vid_stride, slots, fd = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    out = sys.stdout.buffer
    try:
        _decode(path, vid_stride, slots, fd, out)
    except (BrokenPipeError, EOFError):
        pass  # the parent stopped reading
    except Exception as error:  # noqa: BLE001 - handed to the parent, which raises it naming the file
        message = f"{type(error).__name__}: {error}".encode()
        out.write(RECORD.pack(b"X", len(message), 0, 0, 0) + message)
        out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
