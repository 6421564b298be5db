"""Videos whose frames the GPU converts to ``cv2.VideoCapture``'s BGR bytes: which streams that holds for, and the
frames such a decoder gives.

H.264 and HEVC decode exactly by their standards, so a decoder's Y, U and V planes are the samples FFmpeg gives cv2;
the conversion to BGR is where stock's frames come from, and the GPU operators (:func:`..ops.nv12_to_bgr` for NVDEC's
NV12 frames, :func:`..ops.i420_to_bgr` for FFmpeg's planes) reproduce OpenCV's bit for bit with the colour
parameters :func:`..ops.opencv_conversion` gives for the stream (docs/video_design.md). A stream's tags are read
with PyAV from its first decoded frame, the properties FFmpeg puts on the frames cv2 converts
(:func:`probe_stream`); :func:`stream_reason` says why a stream's frames would not be cv2's, and
:func:`gpu_conversion_tags_or_reason` why a converted decoder does not apply here at all. The decoders,
:class:`.av_planes.PlanesVideo` (PyAV on the CPU, the default for a GPU predictor) and :class:`.nvdec.NvdecVideo`
(NVDEC), give :class:`ConvertedFrame` items, :data:`FETCH_FRAMES` converted at a time.

PyAV is optional (the ``[video]`` extra) and imported on first use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import _ext
from ..ops.video_color import opencv_conversion

__all__ = ["FETCH_FRAMES", "ConvertedFrame", "GpuVideo", "StreamTags", "gpu_conversion_tags_or_reason",
           "probe_stream", "stream_reason"]

# FFmpeg's codec names of the streams converted on the GPU (others are not checked against cv2).
CONVERTED_CODECS = ("h264", "hevc")
# The 8-bit 4:2:0 pixel formats FFmpeg's decoders give for them (yuvj420p: full range), as the operators convert.
CONVERTED_PIXEL_FORMATS = ("yuv420p", "yuvj420p")
# Frames a converting decoder converts, copies to the host and waits for at a time.
FETCH_FRAMES = 8


@dataclass(frozen=True)
class GpuVideo:
    """A loader's choice for its videos, made once as the loader is made (:func:`..sources.file_loader`, from
    ``YOLO_FASTDETECT_PYAV_VIDEO`` and ``YOLO_FASTDETECT_GPU_VIDEO``): their frames converted on ``device`` where
    that gives cv2's, decoded by NVDEC (``nvdec``) or else by PyAV to planes.

    Attributes:
        device (torch.device): The CUDA device that converts the frames.
        nvdec (bool): NVDEC decodes (:mod:`.nvdec`); False: PyAV's planes (:mod:`.av_planes`).
        log_skips (bool): The user asked for this decoder: a video cv2 reads instead is logged, with the reason.
    """

    device: torch.device
    nvdec: bool
    log_skips: bool


@dataclass(frozen=True)
class StreamTags:
    """A video stream's codec and the properties of its first decoded frame, as FFmpeg gives them to cv2.

    Attributes:
        codec (str): FFmpeg's codec name ("h264", "hevc", ...).
        width (int): Frame width.
        height (int): Frame height.
        pixel_format (str): FFmpeg's pixel format of the decoded frame ("yuv420p", "yuvj420p", ...).
        colorspace (int): AVColorSpace.
        color_range (int): AVColorRange.
        color_primaries (int): AVColorPrimaries.
        color_trc (int): AVColorTransferCharacteristic.
    """

    codec: str
    width: int
    height: int
    pixel_format: str
    colorspace: int
    color_range: int
    color_primaries: int
    color_trc: int

    def conversion(self, opencv_version: str | None = None) -> tuple[int, bool] | None:
        """:func:`..ops.opencv_conversion` of these tags: ``(colorspace, full_range)``, or None."""
        return opencv_conversion(self.height, self.colorspace, self.color_range, self.color_primaries,
                                 self.color_trc, self.pixel_format, opencv_version)


def probe_stream(path: str) -> StreamTags | None:
    """The :class:`StreamTags` of ``path``'s first video stream, read with PyAV; None where PyAV reads no frame of
    it (cv2 then decides, as stock). Raises ImportError without PyAV.

    Examples:
        >>> probe_stream("clip.mp4")  # doctest: +SKIP
        StreamTags(codec='h264', width=1280, height=720, pixel_format='yuv420p', colorspace=1, ...)
    """
    import av

    try:
        with av.open(path) as container:
            stream = container.streams.video[0]
            frame = next(container.decode(stream), None)
            if frame is None:
                return None
            return StreamTags(stream.codec_context.name, frame.width, frame.height, frame.format.name,
                              int(frame.colorspace), int(frame.color_range), int(frame.color_primaries),
                              int(frame.color_trc))
    except (av.FFmpegError, IndexError, OSError):
        return None


def stream_reason(tags: StreamTags, opencv_version: str | None = None) -> str | None:
    """Why a decoder's planes converted on the GPU would not give cv2's frames of a stream with ``tags``, one line;
    None where they do.

    Examples:
        >>> tags = StreamTags("h264", 1280, 720, "yuv420p", 1, 1, 1, 1)
        >>> stream_reason(tags) is None
        True
        >>> stream_reason(StreamTags("mpeg4", 1280, 720, "yuv420p", 2, 0, 2, 2))
        'codec mpeg4 is not H.264 or HEVC'
    """
    if tags.codec not in CONVERTED_CODECS:
        return f"codec {tags.codec} is not H.264 or HEVC"
    if tags.pixel_format not in CONVERTED_PIXEL_FORMATS:
        return f"pixel format {tags.pixel_format} is not 8-bit 4:2:0"
    if tags.height % 2:
        return f"odd height {tags.height}: OpenCV converts it through swscale's scaler"
    if tags.conversion(opencv_version) is None:
        import cv2

        return (f"OpenCV {opencv_version or cv2.__version__} converts colour tags matrix {tags.colorspace}, "
                f"primaries {tags.color_primaries}, transfer {tags.color_trc} otherwise than a plain matrix")
    return None


def gpu_conversion_tags_or_reason(path: str, operator: str) -> StreamTags | str:
    """``path``'s :class:`StreamTags` where its planes converted on the GPU by ``operator`` (the name, for the
    reason) give ``cv2.VideoCapture``'s frames; otherwise why not, one line."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not _ext.has_cuda_kernels():
        return f"the operators have no CUDA kernels ({operator})"
    try:
        tags = probe_stream(path)
    except ImportError:
        return "PyAV is not installed (pip install 'yolo-fastdetect[video]')"
    if tags is None:
        return "PyAV decodes no frame of it"
    return stream_reason(tags) or tags


@dataclass(frozen=True)
class ConvertedFrame:
    """One frame of a converting decoder (:class:`.av_planes.PlanesVideo`, :class:`.nvdec.NvdecVideo`), converted and
    copied to the host, both copies complete.

    Attributes:
        bgr (torch.Tensor): (H, W, 3) uint8 BGR on the video's device, allocated on :attr:`stream`.
        image (np.ndarray): Its host copy (pinned within :mod:`yolo_fastdetect.pinned`'s budget): the original
            image ``Results`` keep, as stock's ``cv2.VideoCapture`` frame.
        stream (torch.cuda.Stream): The decoder's stream, on which :attr:`bgr` was written (None on the CPU).
    """

    bgr: torch.Tensor
    image: np.ndarray
    stream: torch.cuda.Stream | None
