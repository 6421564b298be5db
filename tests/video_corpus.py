"""Test videos made from the wheel's images: small clips with motion for the video-list tests (OpenCV's mp4v, MJPG,
and H.264 through PyAV where it is installed), broken files (cut mid-file, garbage appended, empty, no frames), and
camera-like H.264 / HEVC clips (pan and zoom, sensor noise, colour tags, variable frame rate) from 480p to 4K for
the colour-conversion tests and the benchmarks.

Camera clips on demand, e.g. for a benchmark: ``python tests/video_corpus.py OUT_DIR --sizes 1080p,4k --frames 300``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from sources_corpus import asset
from yolo_fastdetect.bench._camera_clips import (  # noqa: F401 - the tests' names for them
    CAMERA_SIZES,
    camera_frames,
    write_camera_clip,
    write_clip,
)

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


def opencv_frames(path: Path) -> list[np.ndarray]:
    """Every frame ``cv2.VideoCapture`` reads of ``path``: stock Ultralytics' frames of a video."""
    capture, frames = cv2.VideoCapture(str(path)), []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        frames.append(image)
    capture.release()
    return frames


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
