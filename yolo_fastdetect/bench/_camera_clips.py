"""Camera-like video clips made offline from the wheel's bus.jpg and zidane.jpg, encoded with PyAV: a camera panning
across the two images while it zooms in, with sensor noise, so that every pixel changes from frame to frame and the
people move (the decoder has real work and the detections move). Used by ``bench video``, ``bench sources`` and the
video tests (``tests/video_corpus.py``).

PyAV is optional (the ``[video]`` extra) and imported when a clip is written."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from ._tiny_dataset import asset_images

# Sizes of the camera clips, (width, height).
CAMERA_SIZES = {"480p": (854, 480), "720p": (1280, 720), "1080p": (1920, 1080), "4k": (3840, 2160),
                "1366x768": (1366, 768)}
# AVColorSpace / AVColorPrimaries / AVColorTransferCharacteristic codes (one numbering for the three) that cameras
# write: BT.709 for HD, SMPTE 170M (BT.601) for SD.
BT709, SMPTE170M = 1, 6
# Seconds from one IDR picture to the next that surveillance and action cameras write by default (1-2 s; 2 here).
CAMERA_GOP_S = 2
_ENCODERS = {"h264": "libx264", "hevc": "libx265"}


def _av():
    """The PyAV module, or ImportError saying how to install it."""
    try:
        import av
    except ImportError as error:
        raise ImportError("writing H.264 / HEVC clips needs PyAV (pip install 'yolo-fastdetect[video]')") from error
    return av


def _encoder(codec: str) -> str:
    """PyAV's encoder for ``codec`` ("h264", "hevc", or an encoder's name): x264 / x265 where present."""
    preferred = _ENCODERS.get(codec, codec)
    return preferred if preferred in _av().codecs_available else codec


def write_clip(path: Path, images: Iterable[np.ndarray], width: int, height: int, codec: str = "h264",
               fps: int = 30, frame_times: Sequence[float] | None = None, colorspace: int | None = None,
               primaries: int | None = None, transfer: int | None = None, full_range: bool = False,
               preset: str = "veryfast", gop: int | None = None) -> Path:
    """A yuv420p clip of BGR ``images`` (``width`` x ``height``) encoded by PyAV; needs ``av``.

    Args:
        path: The file to write (its suffix picks the container: .mp4, .mkv, ...).
        images: The frames, BGR uint8 of ``height`` x ``width``.
        width: Frame width (even for yuv420p H.264).
        height: Frame height.
        codec: "h264", "hevc", or a PyAV encoder's name ("mpeg4").
        fps: The nominal frame rate; each frame lasts 1 / fps unless ``frame_times`` is given.
        frame_times: Presentation time of each frame in seconds (increasing): a variable-frame-rate clip.
        colorspace: The AVColorSpace the stream is tagged with; None leaves the encoder's default (unspecified).
        primaries: The AVColorPrimaries tag, likewise.
        transfer: The AVColorTransferCharacteristic tag, likewise.
        full_range: Tag and encode full-range ("pc") samples.
        preset: x264 / x265 preset (the x264 presets from veryfast on use B-frames).
        gop: Frames from one IDR picture to the next, every GOP closed (x264 / x265); None leaves the encoder's
            default (x264: IDR at most every 250 frames; x265: open GOPs, one IDR).

    HEVC clips need 4 frames or more: x265 sometimes gives a clip of 1 to 3 frames packets without timestamps, which
    the MP4 muxer refuses ("pts/dts pair unsupported": 4 of 200 two-frame clips on the development machine, none of
    200 at 4 or 8 frames).

    Returns:
        ``path``.

    Examples:
        >>> frames = camera_frames(30, 1280, 720)
        >>> write_clip(Path("clip.mp4"), frames, 1280, 720, colorspace=BT709)  # doctest: +SKIP
    """
    av = _av()
    stream_options = {"preset": preset} if _encoder(codec) in _ENCODERS.values() else {}
    if _encoder(codec) == "libx265":
        closed_gops = f":keyint={gop}:min-keyint={gop}:open-gop=0:scenecut=0" if gop else ""
        stream_options["x265-params"] = "log-level=error" + closed_gops
    elif gop and _encoder(codec) == "libx264":
        stream_options.update(g=str(gop), keyint_min=str(gop), sc_threshold="0")
    time_base = Fraction(1, 1000) if frame_times is not None else Fraction(1, fps)
    matrix = "itu709" if colorspace == BT709 else "itu601"  # the RGB -> YUV matrix PyAV's reformat knows
    with av.open(str(path), "w") as container:
        stream = container.add_stream(_encoder(codec), rate=fps, options=stream_options)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = time_base
        for name, value in (("colorspace", colorspace), ("color_primaries", primaries), ("color_trc", transfer)):
            if value is not None:
                setattr(stream.codec_context, name, value)
        stream.codec_context.color_range = 2 if full_range else 1
        for index, image in enumerate(images):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24").reformat(
                format="yuv420p", dst_colorspace=matrix, dst_color_range="JPEG" if full_range else "MPEG")
            frame.pts = index if frame_times is None else round(frame_times[index] * 1000)
            frame.time_base = time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _scene() -> np.ndarray:
    """What the camera films: bus.jpg and zidane.jpg side by side, 1080 rows high, BGR."""
    images = [cv2.imread(path) for path in asset_images()]
    return np.concatenate([cv2.resize(image, (round(image.shape[1] * 1080 / image.shape[0]), 1080))
                           for image in images], axis=1)


def camera_frames(frames: int, width: int, height: int, noise: int = 2, seed: int = 0) -> Iterator[np.ndarray]:
    """``frames`` BGR frames of a camera panning across :func:`_scene` while it zooms in (1x to 1.25x), with
    uniform sensor noise of +-``noise`` levels: every pixel changes from frame to frame and the people move. One
    frame at a time, so that 4K clips do not fill the memory.

    Examples:
        >>> next(camera_frames(10, 64, 36)).shape
        (36, 64, 3)
    """
    scene = _scene()
    rng = np.random.default_rng(seed)
    scene_height, scene_width = scene.shape[:2]
    for index in range(frames):
        progress = index / max(1, frames - 1)
        window_height = scene_height / (1 + 0.25 * progress)
        window_width = min(scene_width, window_height * width / height)
        window_height = window_width * height / width
        left = round(progress * (scene_width - window_width))
        top = round((scene_height - window_height) / 2)
        window = scene[top : top + round(window_height), left : left + round(window_width)]
        shrink = window.shape[1] > width
        image = cv2.resize(window, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
        if noise:
            image = np.clip(image + rng.integers(-noise, noise + 1, image.shape, dtype=np.int16), 0, 255)
        yield image.astype(np.uint8)


def camera_size(size: str | tuple[int, int]) -> tuple[int, int]:
    """``(width, height)`` of ``size``: a key of :data:`CAMERA_SIZES`, "WIDTHxHEIGHT" or the pair itself.

    Examples:
        >>> camera_size("720p"), camera_size("160x96")
        ((1280, 720), (160, 96))
    """
    if isinstance(size, str):
        return CAMERA_SIZES.get(size) or tuple(int(side) for side in size.split("x"))
    return tuple(size)


def write_camera_clip(path: Path, frames: int, size: str | tuple[int, int] = "720p", codec: str = "h264",
                      fps: int = 30, frame_times: Sequence[float] | None = None, full_range: bool = False,
                      preset: str = "veryfast", gop: int | None = CAMERA_GOP_S * 30) -> Path:
    """A camera-like clip of :func:`camera_frames`: ``size`` as :func:`camera_size` reads it, tagged BT.709 from 720
    rows up and SMPTE 170M below, as cameras tag them, an IDR picture every ``gop`` frames (cameras' default: every
    :data:`CAMERA_GOP_S` seconds at 30 FPS); ``frame_times`` makes it a variable-frame-rate clip. Needs ``av``.

    Examples:
        >>> write_camera_clip(Path("camera_720p.mp4"), 300, "720p")  # doctest: +SKIP
    """
    width, height = camera_size(size)
    tag = BT709 if height >= 720 else SMPTE170M
    return write_clip(path, camera_frames(frames, width, height), width, height, codec, fps, frame_times, tag, tag,
                      tag, full_range, preset, gop)
