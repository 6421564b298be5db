"""Decode-only passes with ``cv2.VideoCapture``, as stock's video reader decodes: every frame grabbed and retrieved.

Run as a script (``python _cv2_decode.py PATH``) it is one process of the video benchmark's many-process ceiling:
it imports only cv2, prints ``ready``, waits for a line on stdin (so that every process starts decoding at once,
their imports left out), decodes ``PATH`` and prints the frame count."""

from __future__ import annotations

import sys

import cv2


def cv2_frames(path: str) -> int:
    """The frames ``cv2.VideoCapture`` decodes from ``path`` (grab, then retrieve: BGR, as stock reads them)."""
    capture, count = cv2.VideoCapture(path), 0
    try:
        while capture.grab():
            retrieved, _ = capture.retrieve()
            count += retrieved
    finally:
        capture.release()
    return count


if __name__ == "__main__":
    print("ready", flush=True)
    sys.stdin.readline()
    print(cv2_frames(sys.argv[1]), flush=True)
