"""Upload-ahead: decoded images go to the GPU from the decoder threads, on a side stream, so that the patched
``preprocess`` finds its image already there and only letterboxes it.

Without it the predictor's thread uploads each batch itself (the letterbox packs the original images into pinned
memory, then copies them to the GPU). With it each decoder thread (or the video reader) copies the image it decoded
into pinned memory and starts its transfer; the predictor waits for the transfer on the GPU, not on the host. That
is worth it where the predictor's thread bounds the pipeline, at batch 1 (the measurement is in
:mod:`yolo_fastdetect.sources`, which decides where it applies).

:class:`Uploads` finds an image's copy by the image's identity: the loader returns the same numpy arrays (stock's
``im0s``, which ``Results`` keep), and the copies ride beside them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .prefetch import read_ahead_window

UPLOAD_BUDGET_BYTES = 4 << 30  # at most this much (or an eighth of the GPU's memory) uploaded ahead at once


@dataclass(frozen=True)
class _Upload:
    image: np.ndarray  # the host image (held, so that its id is not reused while the entry lives)
    tensor: torch.Tensor  # its (H, W, 3) uint8 copy on the GPU
    done: torch.cuda.Event  # recorded on the copy's stream after it


class Uploads:
    """Images uploaded ahead to ``device``: :meth:`put` on a decoder thread, :meth:`take` on the predictor's.

    At most ``capacity`` images (oldest dropped first: a dropped image's batch is uploaded by the predictor as
    without upload-ahead) and :data:`UPLOAD_BUDGET_BYTES` or an eighth of the GPU's memory, whichever is less (an
    image that would exceed it, or that finds the GPU out of memory, stays on the host).

    Args:
        device (torch.device): The predictor's CUDA device.
        capacity (int): Images held at most: the loader's read-ahead plus the batches in the predictor's hands.

    Examples:
        >>> uploads = Uploads(torch.device("cuda", 0), capacity=8)
        >>> image = uploads.put(np.zeros((480, 640, 3), np.uint8))  # on a decoder thread
        >>> tensors = uploads.take([image])  # on the predictor's thread: [(480, 640, 3) uint8 on cuda:0]
    """

    def __init__(self, device: torch.device, capacity: int):
        self.device = device
        self._capacity = max(1, capacity)
        self._budget = min(UPLOAD_BUDGET_BYTES, torch.cuda.get_device_properties(device).total_memory // 8)
        self._stream = torch.cuda.Stream(device)
        self._entries: OrderedDict[int, _Upload] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, image: np.ndarray | None) -> np.ndarray | None:
        """Start copying ``image`` to the GPU (a contiguous uint8 BGR image; anything else is left alone); returns
        ``image``, so that it can wrap a decode function's result."""
        if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3
                and image.shape[2] == 3 and image.flags.c_contiguous) or not self._reserve(image):
            return image
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
                # pin_memory copies on this thread; the transfer runs on the side stream. The caching host allocator
                # reuses the pinned block only after the transfer that reads it has completed.
                tensor = torch.from_numpy(image).pin_memory().to(self.device, non_blocking=True)
                self._register(image, tensor, self._stream)
        except torch.OutOfMemoryError:
            with self._lock:
                self._bytes -= image.nbytes
        return image

    def add(self, image: np.ndarray, tensor: torch.Tensor) -> None:
        """Hold ``tensor``, ``image``'s copy already on the device (written on its current stream), for :meth:`take`
        (unless that exceeds the budget: the predictor then uploads ``image``)."""
        if self._reserve(image):
            self._register(image, tensor, torch.cuda.current_stream(self.device))

    def _reserve(self, image: np.ndarray) -> bool:
        """Count ``image``'s bytes against the budget; False where they do not fit."""
        with self._lock:
            if self._bytes + image.nbytes > self._budget:
                return False
            self._bytes += image.nbytes  # reserved now, so that concurrent decoders respect the budget
            return True

    def _register(self, image: np.ndarray, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        done = torch.cuda.Event()
        done.record(stream)
        with self._lock:
            self._entries[id(image)] = _Upload(image, tensor, done)
            while len(self._entries) > self._capacity:
                self._bytes -= self._entries.popitem(last=False)[1].image.nbytes

    def take(self, images: Sequence[np.ndarray]) -> list[torch.Tensor] | None:
        """The GPU copies of ``images``, usable on the device's current stream, or None unless every one of them was
        uploaded. The copies are forgotten here: the caller holds them from now on."""
        with self._lock:
            entries = [self._entries.get(id(image)) for image in images]
            if not all(entry is not None and entry.image is image for entry, image in zip(entries, images)):
                return None
            for entry in entries:
                if self._entries.pop(id(entry.image), None) is not None:
                    self._bytes -= entry.image.nbytes
        stream = torch.cuda.current_stream(self.device)
        for entry in entries:
            stream.wait_event(entry.done)
            entry.tensor.record_stream(stream)  # allocated on the side stream, used and freed on this one
        return [entry.tensor for entry in entries]

    def clear(self) -> None:
        """Drop every copy not taken yet (the loader stops)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


def loader_uploads(upload_to: torch.device | None, batch: int, threads: int, read_ahead: int) -> Uploads | None:
    """The :class:`Uploads` of a loader that decodes ``read_ahead`` batches (at least one image per thread) ahead,
    or None without a device: room for the read-ahead, the frame a video reader holds while it waits for room in its
    queue, the batch in stock's prefetch and the predictor's."""
    if upload_to is None:
        return None
    return Uploads(upload_to, capacity=read_ahead_window(batch, threads, read_ahead) + 1 + 2 * batch)
