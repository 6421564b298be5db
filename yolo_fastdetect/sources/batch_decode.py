"""Image files a batch at a time, the GIL released for the whole batch: the machinery under the loaders (and the Ray
rows) wherever the decoder threads do not upload ahead.

Decoder threads in Python need the GIL between two files, and the predictor's thread holds it for much of each
batch: on the H200 host 15 threads decode 896 img/s alone and 268 beside one thread running pure Python, and a
folder at batch 16 and 64 reached 61-72 % of its ceiling (benchmarks/RESULTS.md). :class:`BatchDecoder` hands a
batch's JPEGs to :func:`~yolo_fastdetect.ops.jpeg_files.decode_jpeg_files`, which reads and decodes them on threads
of the operator library to OpenCV's bytes, and decodes what that declines (other formats, CMYK, truncated files,
...) the loader's own way, on threads of its own. :func:`batched_prefetch` hands each decoder thread about its share
of a batch per call, keeps ``read_ahead`` batches in flight and hands the results back one at a time, as the
per-image read-ahead does.

Opt-in (``YOLO_FASTDETECT_BATCH_DECODE=1``, see :mod:`yolo_fastdetect.sources`): its one run on the H200 host
(5773e51, ``bench sources`` at batch 64) gave a list 457 img/s, 73 % of its ceiling, and a folder 386 img/s, 57 %,
against 397 (77 %) and 417 (72 %) with the per-image threads in an earlier run on another machine of the kind; the
A/B in one run is still to come.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .prefetch import Flattened, OrderedPrefetch


def available() -> bool:
    """Whether the batch decoder can run: the operators load, and torchvision's image operators (its decoder)."""
    from yolo_fastdetect import _ext

    if not _ext.available():
        return False
    try:
        from yolo_fastdetect.ops.jpeg_files import _load_torchvision_image_ops

        _load_torchvision_image_ops()
    except (ImportError, RuntimeError, OSError):
        return False
    return True


def _utf8(path: str) -> bool:
    """Whether ``path`` can pass to the operator, as UTF-8; a name with other bytes is left to the loader."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class BatchDecoder:
    """``decode(item)`` for each item of a batch, the items that name a JPEG file decoded together outside the GIL.

    Args:
        decode (Callable): The loader's decode of one item (what the batch decoder declines goes there).
        jpeg_file (Callable[[Any], str | None]): The file to decode for an item, or None to leave the item to
            ``decode``; the image must be what ``decode`` gives for it whenever the operator takes the file.
        finish (Callable[[Any, np.ndarray], Any]): ``decode``'s result for an item from the decoded image.
        apply_exif_orientation (bool): As ``cv2.imdecode`` with ``IMREAD_COLOR`` (True) or with
            ``IMREAD_IGNORE_ORIENTATION`` too (False).
        threads (int): Threads for the items left to ``decode`` (shared by the batches in flight).
        batch_threads (int): Threads of the operator for one batch.

    Examples:
        >>> decoder = BatchDecoder(imread, lambda path: path, lambda path, image: image, True, 8, 8)
        >>> images = decoder(["a.jpg", "b.png"])  # a.jpg by the operator, b.png by imread
        >>> decoder.close()
    """

    def __init__(self, decode: Callable, jpeg_file: Callable[[Any], str | None],
                 finish: Callable[[Any, np.ndarray], Any], apply_exif_orientation: bool, threads: int,
                 batch_threads: int):
        self._decode, self._jpeg_file, self._finish = decode, jpeg_file, finish
        self._exif, self._batch_threads = apply_exif_orientation, max(1, batch_threads)
        self._others = ThreadPoolExecutor(max(1, threads), thread_name_prefix="yolo_fastdetect_decode")

    def __call__(self, items: Sequence) -> list:
        """The results of ``decode`` for ``items``, in order; an exception of ``decode`` is raised here."""
        from yolo_fastdetect.ops.jpeg_files import decode_jpeg_files

        files = [self._jpeg_file(item) for item in items]
        jpegs = [i for i, file in enumerate(files) if file is not None and _utf8(file)]
        results: list = [None] * len(items)
        decoded = decode_jpeg_files([files[i] for i in jpegs], self._batch_threads, self._exif) if jpegs else []
        others = {}
        for i, image in zip(jpegs, decoded):
            if image is not None:
                results[i] = self._finish(items[i], image)
        for i, item in enumerate(items):
            if results[i] is None:
                others[i] = self._others.submit(self._decode, item)
        for i, future in others.items():
            results[i] = future.result()
        return results

    def close(self) -> None:
        """Join the threads of the items left to ``decode`` (call it after no batch runs any more)."""
        self._others.shutdown(wait=True, cancel_futures=True)


def batched_prefetch(items: Sequence, batch: int, read_ahead: int, threads: int, decode: Callable,
                     jpeg_file: Callable[[Any], str | None], finish: Callable[[Any, np.ndarray], Any],
                     apply_exif_orientation: bool) -> Flattened:
    """The results of ``decode`` for ``items`` (see :class:`BatchDecoder` for the other arguments), returned one
    item at a time, ``read_ahead`` batches of ``batch`` (and at least one call per thread) in flight, as the
    per-image read-ahead keeps them; closing the result joins every thread.

    Each of the ``threads`` threads decodes about its share of a batch per call (``batch / threads`` files): the GIL
    is taken once per call, not once per file, and a thread done with its share takes a share of the next batch
    instead of waiting for the slowest file of its own (as a whole batch split over the threads of one call does)."""
    threads = max(1, threads)
    chunk = -(-batch // threads)
    window = max(-(-read_ahead * batch // chunk), threads)
    decoder = BatchDecoder(decode, jpeg_file, finish, apply_exif_orientation, threads, batch_threads=1)
    chunks = [items[start:start + chunk] for start in range(0, len(items), chunk)]
    return Flattened(OrderedPrefetch(decoder, chunks, threads=threads, window=window), on_close=decoder.close)
