"""Short test videos made from the wheel's images, for the video-list tests: small clips with motion (OpenCV's mp4v,
MJPG, and H.264 through PyAV where it is installed) and broken files (cut mid-file, garbage appended, empty, no
frames)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

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
    """An H.264 clip (yuv420p, so even sizes only) written through PyAV; needs ``av``."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264" if "libx264" in av.codecs_available else "h264", rate=10)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for image in panning_frames(frames, width, height, start):
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


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
