"""A video decoded on the CPU by PyAV to its Y, U and V planes and converted to BGR on a given device, giving
``cv2.VideoCapture``'s frames of the streams :func:`.converted_video.stream_reason` passes.

Why (docs/video_design.md, "The default for a GPU predictor"): cv2's reader spends a good part of each frame in
swscale's conversion to BGR, on the reader's own thread. FFmpeg decoding the same stream with frame threads
(``thread_type="AUTO"``) and stopping at the planes ran 1.35-1.6x as fast as cv2's grab and retrieve on the 2-core
development machine. H.264 and HEVC decode exactly by their standards, so the planes are the ones cv2's swscale
converts, and :func:`..ops.i420_to_bgr` with the parameters of :meth:`.converted_video.StreamTags.conversion` gives
swscale's bytes ("Why the operator is exact"); on a GPU the conversion leaves the CPU altogether, with half of BGR's
bytes to copy there.

On a CUDA device the frames go in batches of :data:`.converted_video.FETCH_FRAMES`: each batch's planes are copied
into one pinned host buffer, sent in one copy, converted in one launch, copied back in one transfer (to pinned memory
within :mod:`..pinned`'s budget) and waited for once, so a batch gives up the GIL a handful of times rather than a few
times per frame (docs/video_design.md, "One decoder without the GIL"). The frames are
:class:`.converted_video.ConvertedFrame` items, as :class:`.nvdec.NvdecVideo` gives them.

What stays the caller's: cv2's frame semantics around the frames (frame count and rate, a failed grab, stock's
errors), and reading with cv2 what this module refuses: a stream :func:`.converted_video.stream_reason` rules out
(``ValueError`` on construction), and the rest of a stream whose format, size or colour tags change, or which FFmpeg
fails to decode, part way (:class:`MidStreamError`, raised after the frames before it).

PyAV is optional (the ``[video]`` extra) and imported on first use.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import numpy as np
import torch

from ..ops.video_color import i420_to_bgr
from ..pinned import host_copy_buffer, pinned_empty
from .converted_video import (
    FETCH_FRAMES,
    ConvertedFrame,
    StreamTags,
    gpu_conversion_tags_or_reason,
    probe_stream,
    stream_reason,
)

__all__ = ["MidStreamError", "PlanesVideo", "planes_tags_or_reason"]


def planes_tags_or_reason(path: str) -> StreamTags | str:
    """``path``'s :class:`.converted_video.StreamTags` where :class:`PlanesVideo` on a CUDA device gives
    ``cv2.VideoCapture``'s frames of it (hand them to it); otherwise why not, one line."""
    return gpu_conversion_tags_or_reason(path, "i420_to_bgr")


class MidStreamError(ValueError):
    """PyAV's frames of a video stopped being ones :class:`PlanesVideo` converts as cv2 does, from frame
    :attr:`frame_index` on: their pixel format, size or colour tags changed from the first frame's, or FFmpeg failed
    to decode. The frames before it were given and stay valid; cv2 reads the rest.

    Attributes:
        path (str): The video file.
        frame_index (int): The first frame not given (0-based, in display order).
        reason (str): What changed, or FFmpeg's error, one line.
    """

    def __init__(self, path: str, frame_index: int, reason: str):
        super().__init__(f"PlanesVideo: {path}: from frame {frame_index} on, {reason}")
        self.path, self.frame_index, self.reason = path, frame_index, reason

    def __reduce__(self):
        return type(self), (self.path, self.frame_index, self.reason)


def _describe(properties: tuple[str, int, int, int, int, int, int]) -> str:
    """A frame's checked properties (see :meth:`PlanesVideo._properties`) in words."""
    pixel_format, width, height, colorspace, color_range, primaries, transfer = properties
    return (f"{pixel_format} {width}x{height}, matrix {colorspace}, range {color_range}, primaries {primaries}, "
            f"transfer {transfer}")


class PlanesVideo:
    """A video decoded by PyAV on the CPU to Y, U and V planes and converted to BGR on ``device`` as
    ``cv2.VideoCapture`` converts it: iterating gives its frames in display order as
    :class:`.converted_video.ConvertedFrame` items, the same frames as cv2's.

    On a CUDA device ``bgr`` is (H, W, 3) uint8 on the device, written on a ``torch.cuda.Stream`` of the iteration's
    own (``stream``), and ``image`` its host copy (pinned within :mod:`..pinned`'s budget); both are complete when
    given. On the CPU ``bgr`` is a CPU tensor, ``image`` the same bytes (``bgr.numpy()``) and ``stream`` None.

    Each iteration opens the file and decodes it from the start, closing an earlier one still open. The video keeps
    no strong reference to a running iteration: one abandoned with ``break`` closes its file as it is collected (at
    once in CPython), and :meth:`close` closes one still held.

    Args:
        path (str): The video file.
        device (torch.device | str): Where the frames are converted: "cpu" or a CUDA device.
        tags (StreamTags | None): The stream's tags from :func:`.converted_video.probe_stream`, when already probed.

    Attributes:
        tags (StreamTags): The stream's codec, size and colour tags (its first frame's).
        device (torch.device): The device converted on (a CUDA device with its index).

    Raises:
        ValueError: The stream is not one whose frames this gives as cv2 does
            (:func:`.converted_video.stream_reason`), PyAV decodes no frame of it (no such file, not a video), or
            ``device`` is neither the CPU nor CUDA; the message names the file and the reason.
        ImportError: PyAV is not installed.

    Examples:
        >>> with PlanesVideo("clip.mp4", "cuda") as video:  # doctest: +SKIP
        ...     for frame in video:  # frame.bgr: (720, 1280, 3) uint8 on cuda:0; frame.image: its host copy
        ...         pass
        >>> [frame.image.shape for frame in PlanesVideo("clip.mp4", "cpu")][:2]  # doctest: +SKIP
        [(720, 1280, 3), (720, 1280, 3)]
    """

    def __init__(self, path: str, device: torch.device | str, tags: StreamTags | None = None):
        self.tags = tags or probe_stream(path)
        reason = "PyAV decodes no frame of it" if self.tags is None else stream_reason(self.tags)
        if reason is not None:
            raise ValueError(f"PlanesVideo: {path}: {reason}")
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"PlanesVideo: {path}: device must be the CPU or a CUDA device, not {device}")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device, self._path = device, path
        self._conversion = self.tags.conversion()
        self._expected = (self.tags.pixel_format, self.tags.width, self.tags.height, self.tags.colorspace,
                          self.tags.color_range, self.tags.color_primaries, self.tags.color_trc)
        # Each frame's planes in a staging row: Y (H, W), then U and V (ceil(H / 2), ceil(W / 2)), packed.
        luma, chroma = (self.tags.height, self.tags.width), ((self.tags.height + 1) // 2, (self.tags.width + 1) // 2)
        self._plane_shapes = (luma, chroma, chroma)
        self._running: weakref.ref[Iterator[ConvertedFrame]] | None = None

    def __enter__(self) -> PlanesVideo:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the running iteration's file, if any (idempotent); its frames given so far stay valid."""
        running = self._running() if self._running is not None else None
        if running is not None:
            running.close()
        self._running = None

    def __iter__(self) -> Iterator[ConvertedFrame]:
        self.close()
        frames = self._frames()
        self._running = weakref.ref(frames)
        return frames

    def _frames(self) -> Iterator[ConvertedFrame]:
        """The video's frames, a batch of up to :data:`.converted_video.FETCH_FRAMES` staged, converted and given at a
        time; :class:`MidStreamError` after the frames decoded before a change or FFmpeg's failure."""
        import av

        frame_bytes = sum(rows * columns for rows, columns in self._plane_shapes)
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device) if cuda else None
        # One staging buffer for the iteration: each batch's copy from it is waited for before the next is staged.
        shape = (FETCH_FRAMES, frame_bytes)
        staging = pinned_empty(shape, torch.uint8) if cuda else torch.empty(shape, dtype=torch.uint8)
        targets = list(zip(*(planes.numpy() for planes in self._plane_views(staging))))  # per row: Y, U, V
        with av.open(self._path) as container:
            staged, failure = 0, None
            try:
                for frame in self._decoded(container):
                    for plane, target in zip(frame.planes, targets[staged]):
                        rows, columns = target.shape
                        np.copyto(target, np.frombuffer(plane, np.uint8).reshape(rows, plane.line_size)[:, :columns])
                    staged += 1
                    if staged == FETCH_FRAMES:
                        yield from self._converted(staging, staged, stream)
                        staged = 0
            except MidStreamError as error:
                failure = error
            yield from self._converted(staging, staged, stream)
            if failure is not None:
                raise failure

    def _decoded(self, container) -> Iterator:
        """PyAV's frames of ``container``'s first video stream (FFmpeg's frame threads), each checked to have the
        first frame's pixel format, size and colour tags; :class:`MidStreamError` at the first that has not, or
        where FFmpeg fails."""
        import av

        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        index = 0
        try:
            for frame in container.decode(stream):
                properties = self._properties(frame)
                if properties != self._expected:
                    raise MidStreamError(self._path, index, f"the frames are {_describe(properties)}, not "
                                                            f"{_describe(self._expected)} as the first")
                yield frame
                index += 1
        except av.FFmpegError as error:
            raise MidStreamError(self._path, index, f"FFmpeg failed to decode: {error}") from error

    @staticmethod
    def _properties(frame) -> tuple[str, int, int, int, int, int, int]:
        """A PyAV frame's pixel format, size and colour tags, as :class:`.converted_video.StreamTags` holds them."""
        return (frame.format.name, frame.width, frame.height, int(frame.colorspace), int(frame.color_range),
                int(frame.color_primaries), int(frame.color_trc))

    def _plane_views(self, planes: torch.Tensor) -> list[torch.Tensor]:
        """The Y, U and V planes of staging rows ((N, frame bytes) uint8) as (N, rows, columns) views."""
        views, start = [], 0
        for rows, columns in self._plane_shapes:
            views.append(planes[:, start : start + rows * columns].unflatten(1, (rows, columns)))
            start += rows * columns
        return views

    def _converted(self, staging: torch.Tensor, count: int, stream: torch.cuda.Stream | None) -> list[ConvertedFrame]:
        """The first ``count`` staged frames converted to BGR in one call: on a CUDA device copied there in one
        transfer, converted on ``stream`` and copied back to host memory (pinned within its budget) in one, and waited
        for once; per frame its tensor and host array (views of the batch's buffers), complete."""
        if count == 0:
            return []
        if stream is None:
            bgr = host = i420_to_bgr(*self._plane_views(staging[:count]), *self._conversion)
        else:
            with torch.cuda.device(self.device), torch.cuda.stream(stream):
                planes = staging[:count].to(self.device, non_blocking=True)
                bgr = i420_to_bgr(*self._plane_views(planes), *self._conversion)
                host = host_copy_buffer(tuple(bgr.shape))
                host.copy_(bgr, non_blocking=True)
            stream.synchronize()
        return [ConvertedFrame(tensor, image, stream) for tensor, image in zip(bgr.unbind(0), host.numpy())]
