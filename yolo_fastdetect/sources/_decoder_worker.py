"""One decoder process of :mod:`yolo_fastdetect.sources.decoder_processes`, run as a script (numpy and OpenCV only:
importing the package would import torch and Ultralytics, seconds per process).

It reads ``(job, path, flags, whole_jpeg)`` requests from the Unix socket whose descriptor is its argument, and
answers each, in order, with ``(job, shape)`` and a memfd holding the image's bytes, or ``(job, None)`` where it
declines: an unreadable or empty file, one that does not end in its EOI marker where ``whole_jpeg`` asks for it, one
OpenCV does not decode, or a result that is not 8-bit. The parent sends only files its own decode would decode with
``cv2.imdecode(np.fromfile(path), flags)`` alone (for a folder: not TIFF, not the suffixes Ultralytics' ``imread``
hands to Pillow; for a list: the JPEGs that OpenCV decodes to Pillow's bytes), and decodes what is declined itself.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys

import cv2
import numpy as np
from jpeg_bytes import ends_in_eoi  # this script's folder is first on sys.path


def decode(path: str, flags: int, whole_jpeg: bool = False) -> np.ndarray | None:
    """The image as ``imread`` returns it for such a file (a gray one as ``(h, w, 1)``), or None to decline."""
    try:
        data = np.fromfile(path, np.uint8)
    except OSError:
        return None
    if not data.size or (whole_jpeg and not ends_in_eoi(data)):
        return None
    image = cv2.imdecode(data, flags)
    if image is None or image.dtype != np.uint8:
        return None
    return image[..., None] if image.ndim == 2 else image


def shared_copy(image: np.ndarray) -> int:
    """A memfd holding ``image``'s bytes (written by the kernel: no page faults here)."""
    memfd = os.memfd_create("yolo_fastdetect_image", os.MFD_CLOEXEC)
    view = memoryview(np.ascontiguousarray(image)).cast("B")
    written = 0
    while written < len(view):
        written += os.write(memfd, view[written:])
    return memfd


def serve(connection: socket.socket) -> None:
    """Answer requests until the parent closes its end."""
    while message := connection.recv(1 << 16):
        job, path, flags, whole_jpeg = pickle.loads(message)
        image = decode(path, flags, whole_jpeg)
        if image is None:
            connection.send(pickle.dumps((job, None)))
            continue
        memfd = shared_copy(image)
        try:
            socket.send_fds(connection, [pickle.dumps((job, image.shape))], [memfd])
        finally:
            os.close(memfd)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent stops us
    try:
        serve(socket.socket(fileno=int(sys.argv[1])))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent went away
