"""A video decoded by stock's rules in a process of its own, its frames handed over through shared memory.

A reader thread in the predictor's process (:class:`.video.VideoReader`) takes the GIL back after every ``grab`` and
``retrieve``, and the predictor's own Python holds it most of the time: the thread waits up to the interpreter's
switch interval each time, and the more videos decode at once the worse. Here each video decodes in a child process
(``stock_video.py`` run as a script: cv2 and numpy only) into a ring of frames in a ``memfd`` both map; the
predictor's thread copies each frame out as it asks for it (the ``Results`` keep their frames) and gives the slot
back. No thread of ours shares the GIL with the predictor, and the process decodes ahead while the GPU runs.

:class:`VideoProcess` is one video; its :meth:`~VideoProcess.get` gives what :class:`.video.VideoReader` gives for
that video, in the same order, with stock's ``FileNotFoundError`` for a video that does not open. A process that
fails or dies raises one ``RuntimeError`` naming the file. :func:`process_decoding_applies` says where it is used.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .. import config
from .stock_video import RECORD, SLOT, VIDEO_END, VideoFrame, VideoStart
from .upload import Upload

PROCESS_VARIABLE = "YOLO_FASTDETECT_VIDEO_PROCESS"
_SCRIPT = str(Path(__file__).with_name("stock_video.py"))


def process_decoding_applies(paths: list[str], gray: bool, gpu_frames: object | None) -> bool:
    """Whether one video decodes in a :class:`VideoProcess`: one colour video read with cv2 (not with NVDEC), on
    Linux (``memfd``), unless ``YOLO_FASTDETECT_VIDEO_PROCESS=0``."""
    return (len(paths) == 1 and not gray and gpu_frames is None and hasattr(os, "memfd_create")
            and bool(config.get(PROCESS_VARIABLE)))


class _Shared:
    """What the process shares with its parent: the process and its pipes, the memfd and its mapping. The mapping
    lives while a frame handed out of it does (each :class:`_SlotFrame` holds this object); :meth:`end` ends the
    process and closes the rest."""

    def __init__(self, process: subprocess.Popen, fd: int):
        self.process, self.fd = process, fd
        self.shape: tuple[int, ...] = ()
        self.frame_bytes = self.address = 0
        self._memory: mmap.mmap | None = None
        self._exported: ctypes.Array | None = None
        self._returns = threading.Lock()

    def map(self, shape: tuple[int, ...]) -> None:
        """Map the slots, frames of ``shape``, that the process has just made."""
        self.shape, self.frame_bytes = shape, int(np.prod(shape))
        self._memory = mmap.mmap(self.fd, 0)
        self._exported = ctypes.c_char.from_buffer(self._memory)  # (unmapped with the last reference, not before)
        self.address = ctypes.addressof(self._exported)

    def give_back(self, slot: int) -> None:
        """Tell the process it may fill ``slot`` again (from any thread: a frame's finalizer)."""
        with self._returns, contextlib.suppress(OSError, ValueError):  # the process has ended, or its pipe closed
            self.process.stdin.write(SLOT.pack(slot))
            self.process.stdin.flush()

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        with self._returns:
            for pipe in (self.process.stdin, self.process.stdout):
                with contextlib.suppress(OSError):  # a write to a process that has ended
                    pipe.close()
        os.close(self.fd)


class _SlotFrame:
    """One slot's frame, handed out without a copy: ``np.asarray`` of it is the frame, and that array and every
    view of it keep this object, which gives the slot back to the process when the last of them goes."""

    def __init__(self, shared: _Shared, slot: int):
        self.__array_interface__ = {"shape": shared.shape, "typestr": "|u1", "version": 3,
                                    "data": (shared.address + slot * shared.frame_bytes, False)}
        self._shared = shared  # the mapping stays while the frame does
        weakref.finalize(self, shared.give_back, slot)


class VideoProcess:
    """``path`` decoded by stock's rules (every ``vid_stride``-th frame) in a child process, up to ``slots`` frames
    ahead.

    :meth:`get` returns a :class:`.stock_video.VideoStart`, then the video's :class:`.stock_video.VideoFrame` items
    (``on_frame(image)`` gives each one's upload, as on the reader thread), then :data:`.stock_video.VIDEO_END` unless
    the last frame said ``last``. A frame is the process's shared memory until nothing references it; frames decode
    into the slots that are free, and come through the pipe where a caller keeps all of them. The process ends at
    :meth:`close` or garbage collection.

    Examples:
        >>> video = VideoProcess("clip.mp4", vid_stride=1, slots=16)  # doctest: +SKIP
        >>> start = video.get()  # VideoStart(fps=30.0, frames=300); then the frames
    """

    def __init__(self, path: str, vid_stride: int, slots: int,
                 on_frame: Callable[[np.ndarray], Upload | None] | None = None):
        self.path, self._on_frame = path, on_frame
        fd = os.memfd_create("yolo_fastdetect_video")
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this cv2
        isolate = ["-P"] if sys.version_info >= (3, 11) else []  # not the script's folder on its path
        try:
            process = subprocess.Popen(
                [sys.executable, *isolate, _SCRIPT, path, str(vid_stride), str(max(2, min(slots, 1 << 16))), str(fd)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(fd,), env=environment,
            )
        except BaseException:
            os.close(fd)
            raise
        self._shared = _Shared(process, fd)
        self._finalizer = weakref.finalize(self, self._shared.end)
        self._count: int | None = None
        self._frame = 0

    def get(self) -> VideoStart | VideoFrame | str:
        """The next item; raises stock's ``FileNotFoundError`` for a video that does not open, RuntimeError where
        the process failed."""
        if self._count is None:
            return self._start()
        while True:
            kind, *numbers = RECORD.unpack(self._read(RECORD.size))
            if kind == b"S":
                self._shared.map(tuple(n for n in numbers[:3] if n))
            elif kind == b"F":
                return self._frame_of(np.asarray(_SlotFrame(self._shared, numbers[0])))
            elif kind == b"I":
                shape = tuple(n for n in numbers[:3] if n)
                image = np.frombuffer(self._read(int(np.prod(shape)), bytearray), np.uint8).reshape(shape)
                return self._frame_of(image)
            elif kind == b"E":
                return VIDEO_END
            elif kind == b"X":
                message = self._read(numbers[0]).decode(errors="replace")
                self.close()
                raise RuntimeError(f"yolo_fastdetect: decoding {self.path} failed: {message}")
            else:
                self._fail(f"sent an unknown record {kind!r}")

    def close(self) -> None:
        """End the process (idempotent); the frames handed out stay valid."""
        self._finalizer()

    def _start(self) -> VideoStart:
        line = self._shared.process.stdout.readline()
        if not line.endswith(b"\n"):
            self._fail("ended before it opened the video")
        header = json.loads(line)
        if not header["opened"]:
            self.close()
            raise FileNotFoundError(f"Failed to open video {self.path}")
        self._count = header["frames"]
        return VideoStart(header["fps"], self._count)

    def _frame_of(self, image: np.ndarray) -> VideoFrame:
        self._frame += 1
        upload = self._on_frame(image) if self._on_frame is not None else None
        return VideoFrame(image, self._frame == self._count, upload)

    def _read(self, size: int, into: type = bytes) -> bytes | bytearray:
        """``size`` bytes of the process's output (a writable ``bytearray`` with ``into=bytearray``)."""
        data = bytearray(size)
        view, filled = memoryview(data), 0
        while filled < size:
            got = self._shared.process.stdout.readinto(view[filled:])
            if not got:
                self._fail("ended unexpectedly")
            filled += got
        return data if into is bytearray else bytes(data)

    def _fail(self, what: str):
        code = self._shared.process.poll()
        self.close()
        raise RuntimeError(f"yolo_fastdetect: the decoder process of {self.path} {what}"
                           + (f" (exit status {code})" if code is not None else ""))
