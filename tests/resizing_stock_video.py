"""The decoder process of ``yolo_fastdetect.sources.stock_video`` with a capture whose every third frame has another
shape (cv2 itself keeps a stream's first size): the path where a frame comes through the pipe whole. Run by
``tests/test_video_process.py`` in place of ``stock_video.py``."""

from __future__ import annotations

import sys

import cv2
import numpy as np

from yolo_fastdetect.sources import stock_video

REAL_CAPTURE = cv2.VideoCapture


def reshaped(frame: np.ndarray, index: int) -> np.ndarray:
    """The ``index``-th retrieved frame (from 1) as this capture gives it: every third one 4 rows and 8 columns
    larger."""
    return cv2.resize(frame, (frame.shape[1] + 8, frame.shape[0] + 4)) if index % 3 == 0 else frame


class ResizingCapture:
    """A ``cv2.VideoCapture`` whose retrieved frames are :func:`reshaped` (a wrapper: Python subclasses of
    cv2.VideoCapture crash the interpreter at exit)."""

    def __init__(self, path: str):
        self._capture, self._retrieved = REAL_CAPTURE(path), 0

    def __getattr__(self, name: str):
        return getattr(self._capture, name)

    def retrieve(self, image: np.ndarray | None = None):
        retrieved, frame = self._capture.retrieve()
        if not retrieved:
            return retrieved, frame
        self._retrieved += 1
        frame = reshaped(frame, self._retrieved)
        if image is not None and image.shape == frame.shape:
            image[...] = frame
            frame = image
        return retrieved, frame


if __name__ == "__main__":
    stock_video.cv2.VideoCapture = ResizingCapture
    stock_video.main(sys.argv[1:])
