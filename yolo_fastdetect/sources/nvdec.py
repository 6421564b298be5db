"""H.264 and HEVC video decoded on the GPU with NVDEC (PyNvVideoCodec), converted to BGR as ``cv2.VideoCapture``
converts it.

H.264 and HEVC decoding is exact by the standards, so NVDEC's NV12 frames hold FFmpeg's Y, U and V samples, and
:func:`..ops.nv12_to_bgr` converts them as OpenCV does (:mod:`.converted_video`: which streams that holds for, read
with PyAV); where the stream, PyNvVideoCodec or the environment rule NVDEC out, :func:`nvdec_unavailable_reason` says
why.

PyNvVideoCodec and PyAV are optional (the ``[video]`` extra) and imported on first use. The calls relied on, from
PyNvVideoCodec 2.2: ``CreateDemuxer(filename=...)`` and its ``Demux()`` (a packet: ``bsl`` bytes at ``bsl_data``
in Annex B, ``bsl == 0`` at the end, which flushes the decoder; ``key``, ``pts``), ``GetNvCodecId()``;
``CreateDecoder(gpuid=, codec=, cudacontext=0, cudastream=, usedevicememory=True)`` and its ``Decode(packet)`` (the
frames ready, in display order, valid until the next call; ``getPTS()`` the timestamp of the frame's packet);
``ThreadedDecoder(path, buffer_size, gpu_id=, cuda_context=0, cuda_stream=, use_device_memory=True,
output_color_type=OutputColorType.NATIVE)``, which demuxes and decodes on a thread of its own, and its
``get_batch_frames(n)`` (up to ``n`` frames in display order, valid until the next call; none at the end) and
``end()``; a frame exported with DLPack as one (H + H / 2, W) uint8 NV12 buffer. :class:`NvdecLayoutError` names
what differs where a frame is not that.

One decoder per video (the default) is PyNvVideoCodec's ``ThreadedDecoder``: its decode loop is C++ and does not
take the GIL, where a loop of ``Demux``/``Decode`` calls takes it a few times per frame and slows to a crawl beside
a busy Python thread, such as the predictor's (docs/video_design.md, "One decoder without the GIL"). Each batch it
gives is converted, copied to the host and waited for in one go.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator

import numpy as np
import torch

from ..ops.video_color import nv12_to_bgr
from ..pinned import host_copy_buffer
from .converted_video import (
    FETCH_FRAMES,
    ConvertedFrame,
    StreamTags,
    gpu_conversion_tags_or_reason,
    probe_stream,
    stream_reason,
)
from .gop_segments import InOrderSegments, SegmentOrderError, starts_with_idr

__all__ = ["NvdecLayoutError", "NvdecVideo", "nvdec_tags_or_reason", "nvdec_unavailable_reason", "package_problem"]

# Frames the decoders of one video hold ahead of its consumer (with several), in bytes (GPU and host copies) and at
# most in number: enough for each of 4 decoders to hold its GOP of 60 frames at 720p while an earlier one is handed out.
AHEAD_BYTES = 2 << 30
AHEAD_FRAMES_MAX = 128
# Bytes of a key frame's packet read for its first picture's NAL unit type (after the parameter sets and SEI).
_IDR_BYTES_READ = 4096
# Frames a ThreadedDecoder's thread decodes ahead of the fetches (of FETCH_FRAMES each).
THREADED_BUFFER_FRAMES = 2 * FETCH_FRAMES


class NvdecLayoutError(RuntimeError):
    """PyNvVideoCodec gave a frame in a layout this module does not read (a changed API: no fallback hides it)."""


@functools.cache
def _pynvvideocodec():
    """The PyNvVideoCodec module, or the one-line reason it cannot be used (imported once per process)."""
    try:
        import PyNvVideoCodec
    except ImportError:
        return "PyNvVideoCodec is not installed (pip install 'yolo-fastdetect[video]')"
    except Exception as error:  # noqa: BLE001 - its import checks the driver and raises RuntimeError without one
        lines = str(error).strip().splitlines()  # the first: the rest is its troubleshooting text
        return f"PyNvVideoCodec does not load: {lines[0] if lines else type(error).__name__}"
    return PyNvVideoCodec


def package_problem() -> str | None:
    """Why PyNvVideoCodec cannot be used (not installed, or it does not load: no driver), one line; None where it
    loads."""
    module = _pynvvideocodec()
    return module if isinstance(module, str) else None


def nvdec_tags_or_reason(path: str) -> StreamTags | str:
    """``path``'s :class:`StreamTags` where :class:`NvdecVideo` gives ``cv2.VideoCapture``'s frames of it (hand them
    to it: the probe decodes a frame); otherwise why not, one line (see :func:`nvdec_unavailable_reason`)."""
    return package_problem() or gpu_conversion_tags_or_reason(path, "nv12_to_bgr")


def nvdec_unavailable_reason(path: str) -> str | None:
    """Why :class:`NvdecVideo` would not give ``cv2.VideoCapture``'s frames of ``path``, one line; None where it does
    (PyNvVideoCodec and PyAV load, a CUDA device and the CUDA operators are there, and the stream is H.264 or HEVC,
    8-bit 4:2:0, of even height, with colour tags OpenCV converts with a plain matrix).

    Examples:
        >>> nvdec_unavailable_reason("clip.mp4")  # doctest: +SKIP
        'PyNvVideoCodec is not installed (pip install \'yolo-fastdetect[video]\')'
    """
    outcome = nvdec_tags_or_reason(path)
    return outcome if isinstance(outcome, str) else None


class NvdecVideo:
    """A video decoded with NVDEC on ``device``: iterating gives its frames in stream order as :class:`ConvertedFrame`
    items (as ``cv2.VideoCapture`` gives them, where :func:`nvdec_unavailable_reason` is None; the caller checks it
    first).

    With ``decoders`` > 1 the video's closed GOPs decode on that many decoders at once, each on a thread of its own
    (:mod:`.gop_segments`); a stream with one IDR decodes on one. Each decoder keeps at most :data:`AHEAD_BYTES`
    / ``decoders`` of frames ahead of the consumer (GPU and host copies together).

    Args:
        path (str): An H.264 or HEVC video file.
        device (torch.device): The CUDA device to decode on.
        tags (StreamTags | None): The stream's tags, when already probed.
        decoders (int): NVDEC decoders on this video at once.

    Attributes:
        tags (StreamTags): The stream's codec, size and colour tags.

    Raises:
        ValueError: The stream is not one NVDEC reads as cv2 does (the reason).

    Examples:
        >>> with NvdecVideo("clip.mp4", torch.device("cuda", 0), decoders=4) as video:  # doctest: +SKIP
        ...     for frame in video:  # frame.bgr: (720, 1280, 3) uint8 BGR on cuda:0; frame.image: its host copy
        ...         pass
    """

    def __init__(self, path: str, device: torch.device, tags: StreamTags | None = None, decoders: int = 1):
        module = _pynvvideocodec()
        if isinstance(module, str):
            raise ValueError(f"NvdecVideo: {module}")
        self.tags = tags or probe_stream(path)
        reason = "PyAV decodes no frame of it" if self.tags is None else stream_reason(self.tags)
        if reason is not None:
            raise ValueError(f"NvdecVideo: {path}: {reason}")
        if decoders < 1:
            raise ValueError(f"NvdecVideo: decoders must be at least 1, not {decoders}")
        device = torch.device(device)
        self.device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self._path, self._module, self._decoders = path, module, decoders
        self._conversion = self.tags.conversion()
        frame_bytes = 2 * 3 * self.tags.width * self.tags.height  # the GPU copy and the host copy
        # Frames each of several decoders holds ahead of the consumer (one decoder is fetched from directly).
        self._ahead = min(AHEAD_FRAMES_MAX, max(2, AHEAD_BYTES // decoders // frame_bytes))
        self._running: InOrderSegments | Iterator[ConvertedFrame] | None = None

    def __enter__(self) -> NvdecVideo:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the decoders and release them (idempotent)."""
        if self._running is not None:
            self._running.close()

    def __iter__(self) -> Iterator[ConvertedFrame]:
        # One decoder decodes on ThreadedDecoder's own thread, so its frames are fetched on the consumer's: a thread
        # of ours in between would add a hand-off, each taking the GIL, to every frame.
        if self._decoders == 1:
            self._running = self._decode_whole()
        else:
            self._running = InOrderSegments(self._decoders, self._decode_segments, self._ahead,
                                            name="yolo_fastdetect_nvdec")
        return iter(self._running)

    def _decode_whole(self) -> Iterator[ConvertedFrame]:
        """The whole video's frames from one ``ThreadedDecoder``, fetched a batch at a time."""
        stream = torch.cuda.Stream(self.device)
        decoder = self._module.ThreadedDecoder(
            self._path, THREADED_BUFFER_FRAMES, gpu_id=self.device.index, cuda_context=0,
            cuda_stream=stream.cuda_stream, use_device_memory=True,
            output_color_type=self._module.OutputColorType.NATIVE)
        try:
            while frames := decoder.get_batch_frames(FETCH_FRAMES):
                for bgr, image in self._to_bgr(frames, stream):
                    yield ConvertedFrame(bgr, image, stream)
        finally:
            decoder.end()

    def _decode_segments(self, worker: int, emit) -> int | None:
        """Decode this worker's segments (``decoders`` > 1), each packet demuxed and decoded here, emitting their
        frames; the number of segments, or None where the consumer stopped (:class:`.gop_segments.InOrderSegments`'
        ``produce``)."""
        demuxer = self._module.CreateDemuxer(filename=self._path)
        hevc = self.tags.codec == "hevc"
        stream = torch.cuda.Stream(self.device)
        decoder = None
        segment = -1  # the segment of the packet demuxed last
        segment_of_pts: dict[int, int] = {}  # this worker's packets not decoded to a frame yet
        while True:
            packet = demuxer.Demux()
            end = packet.bsl == 0  # the last Decode call, which flushes the decoder
            if not end:
                if segment < 0 or (packet.key and starts_with_idr(
                        ctypes.string_at(packet.bsl_data, min(packet.bsl, _IDR_BYTES_READ)), hevc)):
                    segment += 1  # segment 0 starts at the first packet, whatever it is
                if segment % self._decoders != worker:
                    continue
                if packet.pts in segment_of_pts:  # a frame's segment is its packet's, told by the timestamp
                    raise SegmentOrderError(f"two packets with timestamp {packet.pts}: frames not told apart")
                segment_of_pts[packet.pts] = segment
            elif decoder is None:
                return segment + 1  # no segment of this worker's
            if decoder is None:
                decoder = self._module.CreateDecoder(gpuid=self.device.index, codec=demuxer.GetNvCodecId(),
                                                     cudacontext=0, cudastream=stream.cuda_stream,
                                                     usedevicememory=True)
            for frame in decoder.Decode(packet):
                frame_segment = segment_of_pts.pop(frame.getPTS(), None)
                if frame_segment is None:
                    raise SegmentOrderError(f"a frame with timestamp {frame.getPTS()} of no packet decoded here")
                # The host copy is waited for: Decode may reuse the frame's buffer from the next call on.
                [(bgr, image)] = self._to_bgr([frame], stream)
                if not emit(frame_segment, ConvertedFrame(bgr, image, stream)):
                    return None
            if end:
                return segment + 1

    def _to_bgr(self, frames: list, stream: torch.cuda.Stream) -> list[tuple[torch.Tensor, np.ndarray]]:
        """``frames`` (NV12 in the decoder's buffers) converted to BGR on ``stream`` in one launch and copied to
        host memory (pinned within its budget) in one transfer: per frame its (H, W, 3) tensor and host array (views
        of the batch's two buffers); both done on return, so the decoder may reuse its buffers. A batch costs a few
        calls that give up the GIL, not a few per frame (docs/video_design.md)."""
        height, width = self.tags.height, self.tags.width
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            surfaces = torch.stack([self._nv12_buffer(frame) for frame in frames])
            bgr = nv12_to_bgr(surfaces[:, :height, :width], surfaces[:, height:, : 2 * ((width + 1) // 2)],
                              *self._conversion)
            host = host_copy_buffer(tuple(bgr.shape))
            host.copy_(bgr, non_blocking=True)
        stream.synchronize()
        return list(zip(bgr.unbind(0), host.numpy()))

    def _nv12_buffer(self, frame) -> torch.Tensor:
        """One frame's (H + H / 2, >= W) uint8 NV12 buffer on the device, as DLPack exports it;
        :class:`NvdecLayoutError` where it is not the NV12 buffer of this stream's size."""
        buffer = torch.from_dlpack(frame)
        height, width = self.tags.height, self.tags.width
        chroma_rows, chroma_bytes = (height + 1) // 2, 2 * ((width + 1) // 2)
        if (buffer.dtype != torch.uint8 or buffer.dim() != 2 or buffer.shape[0] != height + chroma_rows
                or buffer.shape[1] < chroma_bytes or buffer.device != self.device):
            raise NvdecLayoutError(
                f"PyNvVideoCodec gave a frame of shape {tuple(buffer.shape)}, strides {buffer.stride()}, "
                f"{buffer.dtype} on {buffer.device}, not the NV12 buffer ({height + chroma_rows}, >= "
                f"{chroma_bytes}) uint8 on {self.device} of a {width}x{height} stream")
        return buffer
