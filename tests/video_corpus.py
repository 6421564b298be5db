"""Test videos made from the wheel's images: small clips with motion for the video-list tests (OpenCV's mp4v, MJPG,
and H.264 through PyAV where it is installed), broken files (cut mid-file, garbage appended, empty, no frames), and
camera-like H.264 / HEVC clips (pan and zoom, sensor noise, colour tags, variable frame rate) from 480p to 4K for
the colour-conversion tests and the benchmarks.

Camera clips on demand, e.g. for a benchmark: ``python tests/video_corpus.py OUT_DIR --sizes 1080p,4k --frames 300``."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator, Sequence
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from conftest import asset_images
from sources_corpus import asset

try:
    import av
except ImportError:  # PyAV is optional: the H.264 clips are skipped without it
    av = None


def panning_frames(frames: int, width: int, height: int, start: int = 0) -> list[np.ndarray]:
    """``frames`` BGR frames panning across bus.jpg then zidane.jpg (from ``start`` of ``frames`` steps), so that
    consecutive frames differ and the detections move."""
    strip = np.concatenate([np.asarray(asset(i, width, height))[..., ::-1] for i in (0, 1)], axis=1)
    shifts = [(i + start) % max(1, frames) * width // max(1, frames) for i in range(frames)]
    return [np.ascontiguousarray(strip[:, shift : shift + width]) for shift in shifts]


def write_opencv(path: Path, frames: int, width: int, height: int, fourcc: str = "mp4v", start: int = 0,
                 fps: float = 10) -> Path:
    """A clip written by ``cv2.VideoWriter`` (``mp4v`` in .mp4, ``MJPG`` in .avi)."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (width, height))
    for image in panning_frames(frames, width, height, start):
        writer.write(image)
    writer.release()
    return path


def write_h264(path: Path, frames: int, width: int, height: int, start: int = 0) -> Path:
    """An H.264 clip (yuv420p, so even sizes only) of :func:`panning_frames` at 10 fps, written through PyAV; needs
    ``av``."""
    return write_clip(path, panning_frames(frames, width, height, start), width, height, fps=10)


# Sizes of the camera clips, (width, height).
CAMERA_SIZES = {"480p": (854, 480), "720p": (1280, 720), "1080p": (1920, 1080), "4k": (3840, 2160),
                "1366x768": (1366, 768)}
# AVColorSpace / AVColorPrimaries / AVColorTransferCharacteristic codes (one numbering for the three) that cameras
# write: BT.709 for HD, SMPTE 170M (BT.601) for SD.
BT709, SMPTE170M = 1, 6
_ENCODERS = {"h264": "libx264", "hevc": "libx265"}


def _encoder(codec: str) -> str:
    """PyAV's encoder for ``codec`` ("h264", "hevc", or an encoder's name): x264 / x265 where present."""
    preferred = _ENCODERS.get(codec, codec)
    return preferred if preferred in av.codecs_available else codec


def write_clip(path: Path, images: Iterable[np.ndarray], width: int, height: int, codec: str = "h264",
               fps: int = 30, frame_times: Sequence[float] | None = None, colorspace: int | None = None,
               primaries: int | None = None, transfer: int | None = None, full_range: bool = False,
               preset: str = "veryfast") -> Path:
    """A yuv420p clip of BGR ``images`` (``width`` x ``height``) encoded by PyAV; needs ``av``.

    Args:
        codec: "h264", "hevc", or a PyAV encoder's name ("mpeg4").
        fps: The nominal frame rate; each frame lasts 1 / fps unless ``frame_times`` is given.
        frame_times: Presentation time of each frame in seconds (increasing): a variable-frame-rate clip.
        colorspace, primaries, transfer: The AVColorSpace / AVColorPrimaries / AVColorTransferCharacteristic the
            stream is tagged with; None leaves the encoder's default (unspecified).
        full_range: Tag and encode full-range ("pc") samples.
        preset: x264 / x265 preset (the x264 presets from veryfast on use B-frames).
    """
    stream_options = {"preset": preset} if _encoder(codec) in _ENCODERS.values() else {}
    if _encoder(codec) == "libx265":
        stream_options["x265-params"] = "log-level=error"
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
    frame at a time, so that 4K clips do not fill the memory."""
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


def write_camera_clip(path: Path, frames: int, size: str | tuple[int, int] = "720p", codec: str = "h264",
                      fps: int = 30, frame_times: Sequence[float] | None = None, full_range: bool = False,
                      preset: str = "veryfast") -> Path:
    """A camera-like clip of :func:`camera_frames`: ``size`` a key of :data:`CAMERA_SIZES`, "WIDTHxHEIGHT" or
    (width, height), tagged BT.709 from 720 rows up and SMPTE 170M below, as cameras tag them; ``frame_times``
    makes it a variable-frame-rate clip. Needs ``av``."""
    if isinstance(size, str):
        size = CAMERA_SIZES.get(size) or tuple(int(side) for side in size.split("x"))
    width, height = size
    tag = BT709 if height >= 720 else SMPTE170M
    return write_clip(path, camera_frames(frames, width, height), width, height, codec, fps, frame_times, tag, tag,
                      tag, full_range, preset)


def write_broken(folder: Path) -> dict[str, Path]:
    """One file per kind of bad input: ``cut`` (an MJPG .avi cut after about half its bytes: it opens and ends
    early), ``cut_mp4`` (an mp4 cut in half: its index, written last, is gone), ``garbage_appended`` (an mp4 with
    random bytes after its end), ``empty`` (0 bytes), ``no_frames`` (a writer closed without a frame), ``not_video``
    (text named .mp4) and ``missing`` (no file)."""
    folder.mkdir(parents=True, exist_ok=True)
    cut = write_opencv(folder / "cut.avi", 12, 160, 120, fourcc="MJPG")
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    cut_mp4 = write_opencv(folder / "cut_mp4.mp4", 12, 160, 120)
    cut_mp4.write_bytes(cut_mp4.read_bytes()[: cut_mp4.stat().st_size // 2])
    garbage = write_opencv(folder / "garbage_appended.mp4", 10, 160, 120)
    garbage.write_bytes(garbage.read_bytes() + np.random.default_rng(0).bytes(5000))
    (folder / "empty.mp4").write_bytes(b"")
    write_opencv(folder / "no_frames.mp4", 0, 160, 120)
    (folder / "not_video.mp4").write_text("not a video\n" * 50)
    return {"cut": cut, "cut_mp4": cut_mp4, "garbage_appended": garbage, "empty": folder / "empty.mp4",
            "no_frames": folder / "no_frames.mp4", "not_video": folder / "not_video.mp4",
            "missing": folder / "missing.mp4"}


def main(argv: Sequence[str] | None = None) -> None:
    """Write camera clips for a benchmark: one per size and codec, named ``camera_<size>_<codec>.mp4``, and a
    variable-frame-rate one (``camera_vfr_<size>_<codec>.mp4``, frame intervals of 1/60 to 1/10 s) with --vfr."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--sizes", default=",".join(CAMERA_SIZES),
                        help="comma-separated keys of CAMERA_SIZES or WIDTHxHEIGHT")
    parser.add_argument("--codecs", default="h264,hevc")
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--preset", default="veryfast")
    parser.add_argument("--vfr", action="store_true")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    intervals = np.random.default_rng(0).uniform(1 / 60, 1 / 10, args.frames)
    frame_times = np.concatenate([[0.0], np.cumsum(intervals[:-1])]).tolist() if args.vfr else None
    for size in args.sizes.split(","):
        for codec in args.codecs.split(","):
            name = f"camera_{'vfr_' if args.vfr else ''}{size}_{codec}.mp4"
            print(write_camera_clip(args.out_dir / name, args.frames, size, codec, frame_times=frame_times,
                                    preset=args.preset))


if __name__ == "__main__":
    main()
