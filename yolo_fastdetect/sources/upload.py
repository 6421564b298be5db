"""Upload-ahead: decoded images go to the GPU from the decoder threads, on a side stream, so that the patched
``preprocess`` finds its image already there and only letterboxes it.

Without it the predictor's thread uploads each batch itself (the letterbox packs the original images into pinned
memory, then copies them to the GPU). With it each decoder thread (or the video reader) copies the image it decoded
into pinned memory and starts its transfer; the predictor waits for the transfer on the GPU, not on the host. That
is worth it where the predictor's thread bounds the pipeline, at batch 1 (the measurement is in
:mod:`yolo_fastdetect.sources`, which decides where it applies).

:meth:`Uploads.put` returns an :class:`Upload`, the handle of one image's copy, which the loader carries beside the
image to the batch it returns (:class:`.batch.ImageBatch`: stock's ``im0s``, the same numpy arrays, which ``Results``
keep); the predictor asks the batch for the copies, and :meth:`Uploads.take` hands them over.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from ..pinned import pinned_tensor_of
from .prefetch import read_ahead_window

UPLOAD_BUDGET_BYTES = 4 << 30  # at most this much (or an eighth of the GPU's memory) uploaded ahead at once


class Upload:
    """The handle of one image's copy on the GPU, made on a decoder thread by :meth:`Uploads.put` (or
    :meth:`Uploads.add`), carried with the image to its batch; :meth:`Uploads.take` hands the copy over once.

    Attributes:
        image (np.ndarray): The host image (held, so that a batch can check that it still holds this image).
        tensor (torch.Tensor | None): Its ``(H, W, 3)`` uint8 copy on the GPU; None once taken, or dropped by the
            :class:`Uploads` that made it (over its capacity, or cleared).
        done (torch.cuda.Event): Recorded on the copy's stream after it.
        owner (Uploads): What made it, and takes it.
    """

    __slots__ = ("done", "image", "owner", "tensor")

    def __init__(self, image: np.ndarray, tensor: torch.Tensor, done: torch.cuda.Event, owner: Uploads):
        self.image, self.tensor, self.done, self.owner = image, tensor, done, owner


class Uploads:
    """Images uploaded ahead to ``device``: :meth:`put` on a decoder thread, :meth:`take` on the predictor's.

    At most ``capacity`` copies held (oldest dropped first: a dropped image's batch is uploaded by the predictor as
    without upload-ahead) and :data:`UPLOAD_BUDGET_BYTES` or an eighth of the GPU's memory, whichever is less (an
    image that would exceed it, or that finds the GPU out of memory, stays on the host).

    Args:
        device (torch.device): The predictor's CUDA device.
        capacity (int): Images held at most: the loader's read-ahead plus the batches in the predictor's hands.

    Examples:
        >>> uploads = Uploads(torch.device("cuda", 0), capacity=8)
        >>> upload = uploads.put(np.zeros((480, 640, 3), np.uint8))  # on a decoder thread
        >>> tensors = uploads.take([upload])  # on the predictor's thread: [(480, 640, 3) uint8 on cuda:0]
    """

    def __init__(self, device: torch.device, capacity: int):
        self.device = device
        self._capacity = max(1, capacity)
        self._budget = min(UPLOAD_BUDGET_BYTES, torch.cuda.get_device_properties(device).total_memory // 8)
        self._stream = torch.cuda.Stream(device)
        self._held: OrderedDict[Upload, None] = OrderedDict()  # the copies not taken yet, oldest first
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, image: np.ndarray | None) -> Upload | None:
        """Start copying ``image`` to the GPU: its :class:`Upload`, or None where it stays on the host (not a
        contiguous uint8 BGR image, over the budget, or the GPU out of memory)."""
        if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3
                and image.shape[2] == 3 and image.flags.c_contiguous) or not self._reserve(image):
            return None
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
                # A frame retrieved into pinned memory is sent as it is; any other image is pinned by a copy on this
                # thread. The transfer runs on the side stream, and the caching host allocator reuses the pinned
                # block only after the transfer that reads it has completed.
                pinned = pinned_tensor_of(image)
                host = pinned if pinned is not None else torch.from_numpy(image).pin_memory()
                tensor = host.to(self.device, non_blocking=True)
                return self._register(image, tensor, self._stream)
        except torch.OutOfMemoryError:
            with self._lock:
                self._bytes -= image.nbytes
            return None

    def add(self, image: np.ndarray, tensor: torch.Tensor) -> Upload | None:
        """Hold ``tensor``, ``image``'s copy already on the device (written on its current stream): its
        :class:`Upload`, or None where that exceeds the budget (the predictor then uploads ``image``)."""
        if not self._reserve(image):
            return None
        return self._register(image, tensor, torch.cuda.current_stream(self.device))

    def _reserve(self, image: np.ndarray) -> bool:
        """Count ``image``'s bytes against the budget; False where they do not fit."""
        with self._lock:
            if self._bytes + image.nbytes > self._budget:
                return False
            self._bytes += image.nbytes  # reserved now, so that concurrent decoders respect the budget
            return True

    def _register(self, image: np.ndarray, tensor: torch.Tensor, stream: torch.cuda.Stream) -> Upload:
        done = torch.cuda.Event()
        done.record(stream)
        upload = Upload(image, tensor, done, self)
        with self._lock:
            self._held[upload] = None
            while len(self._held) > self._capacity:
                self._release(next(iter(self._held)))
        return upload

    def _release(self, upload: Upload) -> None:
        """Forget ``upload`` and return its bytes (under the lock): its handle no longer holds the copy."""
        del self._held[upload]
        self._bytes -= upload.image.nbytes
        upload.tensor = None

    def take(self, uploads: Sequence[Upload]) -> list[torch.Tensor] | None:
        """The copies of ``uploads`` (this object's), usable on the device's current stream, or None unless every one
        of them is still held. The copies are forgotten here: the caller holds them from now on."""
        with self._lock:
            if not all(upload in self._held for upload in uploads):
                return None
            tensors = [upload.tensor for upload in uploads]
            for upload in uploads:
                if upload in self._held:  # (an upload listed twice is released once)
                    self._release(upload)
        stream = torch.cuda.current_stream(self.device)
        for upload, tensor in zip(uploads, tensors):
            stream.wait_event(upload.done)
            tensor.record_stream(stream)  # allocated on the side stream, used and freed on this one
        return tensors

    def clear(self) -> None:
        """Drop every copy not taken yet (the loader stops)."""
        with self._lock:
            for upload in list(self._held):
                self._release(upload)

    def __len__(self) -> int:
        return len(self._held)


def loader_uploads(upload_to: torch.device | None, batch: int, threads: int, read_ahead: int,
                   open_videos: int = 1) -> Uploads | None:
    """The :class:`Uploads` of a loader that decodes ``read_ahead`` batches (at least one image per thread) ahead,
    or None without a device: room for the read-ahead and the frame a video reader holds while it waits for room in
    its queue (with ``open_videos`` > 1, a batch and that frame per open video), the batch in stock's prefetch and the
    predictor's."""
    if upload_to is None:
        return None
    ahead = max(read_ahead_window(batch, threads, read_ahead) + 1, open_videos * (batch + 1))
    return Uploads(upload_to, capacity=ahead + 2 * batch)
