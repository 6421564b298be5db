#!/usr/bin/env python3
"""Write a test video from the images shipped in the Ultralytics wheel (bus.jpg, zidane.jpg), offline.

    python demo/make_clip.py clip.mp4 --frames 300

The frames alternate between the images, each resized to one frame size; used by the demo's tests and for
benchmarking the demo where there is no camera.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import cv2

# Located without importing ultralytics (which imports torch): this script only needs the image files.
ASSETS = Path(importlib.util.find_spec("ultralytics").submodule_search_locations[0]) / "assets"


def write_clip(path: Path, frames: int, width: int = 640, height: int = 480, fps: float = 30.0) -> None:
    """Write ``frames`` frames alternating bus.jpg and zidane.jpg as an mp4 (mp4v) video."""
    images = [cv2.resize(cv2.imread(str(ASSETS / name)), (width, height)) for name in ("bus.jpg", "zidane.jpg")]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    for index in range(frames):
        writer.write(images[index % len(images)])
    writer.release()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="video file to write (.mp4)")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    args = parser.parse_args()
    write_clip(args.output, args.frames, args.width, args.height)
    print(f"wrote {args.output}: {args.frames} frames {args.width}x{args.height}")
