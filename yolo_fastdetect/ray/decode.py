"""The rows of one Ray Data batch, decoded on the package's parallel decoder (:class:`~yolo_fastdetect.sources.
OrderedPrefetch`), each exactly as a folder source decodes the file (Ultralytics' ``imread``).

A row is a path, or a path and the file's bytes (what ``ray.data.read_binary_files(..., include_paths=True)`` gives).
A row that cannot be decoded becomes an error message instead of an image: one bad file must not fail the batch.

:func:`decode_rows` decodes inside the actor that predicts (``predict_dataset(decode="actor")``);
:func:`decode_batch` is the same decode as a ``map_batches`` stage of its own, run as Ray tasks ahead of the actors
(``decode="tasks"``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import pyarrow as pa

# files._decode is the folder source's decode: Ultralytics' imread, PIL plugins kept serial (no upload-ahead here:
# the actor hands model.predict decoded arrays).
from ..sources import OrderedPrefetch, files


def decode_bytes(data: bytes, path: str, flags: int = cv2.IMREAD_COLOR) -> np.ndarray | None:
    """The bytes of the file ``path``, decoded as the file itself would be (None when unreadable).

    ``imread`` picks its decoder by the file's suffix (TIFF pages, PIL plugins for HEIC/AVIF), so the bytes go
    through a temporary file of the same suffix rather than a second decoder that could drift from it; writing it
    costs far less than the decode.

    Examples:
        >>> image = decode_bytes(Path("bus.jpg").read_bytes(), "bus.jpg")
    """
    with tempfile.NamedTemporaryFile(suffix=Path(path).suffix) as file:
        file.write(data)
        file.flush()
        return files._decode(file.name, flags)


def _decode_row(row: tuple[str, bytes | None], flags: int) -> np.ndarray | str:
    """One row's image, or why it has none."""
    path, data = row
    try:
        image = files._decode(path, flags) if data is None else decode_bytes(data, path, flags)
    except Exception as error:  # noqa: BLE001 - a decoder's own failure is this row's error, not the job's
        return f"image read error: {path}: {type(error).__name__}: {error}"
    if image is not None:
        return image
    if data is None and not os.path.isfile(path):
        return f"file not found: {path}"
    return f"image read error: {path}"  # stock's words for a file that does not decode


def decode_rows(paths: Sequence[str], contents: Sequence[bytes | None] | None, channels: int = 3,
                threads: int = 1, lower_priority: bool = False) -> list[np.ndarray | str]:
    """Each row's BGR (or, for ``channels=1``, gray) image, or an error message, in the rows' order.

    Args:
        paths: The rows' paths.
        contents: The rows' file bytes, or None to read each file from its path.
        channels: Image channels of the model (1 grayscale, 3 BGR).
        threads: Decoder threads.
        lower_priority: Decoder threads below the caller's priority (Linux; for an actor predicting on a GPU, see
            :class:`~yolo_fastdetect.sources.OrderedPrefetch`).

    Examples:
        >>> decode_rows(["bus.jpg", "missing.jpg"], None, threads=2)[1]
        'file not found: missing.jpg'
    """
    flags = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    rows = list(zip(paths, contents if contents is not None else [None] * len(paths)))
    with OrderedPrefetch(partial(_decode_row, flags=flags), rows, threads, len(rows), lower_priority) as decoded:
        return list(decoded)


def decode_batch(batch: dict[str, np.ndarray], channels: int = 3, lower_priority: bool = False) -> pa.Table:
    """A batch of rows (``path``, optionally ``bytes``) as decoded rows, for ``Dataset.map_batches``: columns
    ``path``, ``image`` (what :func:`decode_rows` gives; for a row that failed, an empty ``(0, 0, channels)`` image)
    and ``error`` (the message, or None); ``bytes`` is dropped.

    The rows decode serially: each call is one Ray task of one CPU, and Ray runs as many at once as the cluster has
    CPUs for them.

    Args:
        batch: The rows, as Ray Data's ``batch_format="numpy"`` gives them.
        channels: Image channels of the model (1 grayscale, 3 BGR).
        lower_priority: Decode below the task's priority (Linux): for GPU actors on the same machine, whose
            predicting thread must not wait for a CPU that decode tasks hold.

    Examples:
        >>> import ray
        >>> ds = ray.data.from_items([{"path": "bus.jpg"}, {"path": "missing.jpg"}])
        >>> decoded = ds.map_batches(decode_batch, batch_size=64, batch_format="numpy", num_cpus=1)
        >>> [row["error"] for row in decoded.take_all()]
        [None, 'file not found: missing.jpg']
    """
    from ray.data.extensions import ArrowTensorArray

    paths = [str(path) for path in batch["path"]]
    decoded = decode_rows(paths, batch.get("bytes"), channels, lower_priority=lower_priority)
    # Filled row by row: np.array(list) would stack images of one size into one array. A failed row's image is empty
    # but of the same rank, which Ray's tensor column takes (one size: fixed-shape, else variable-shaped).
    images = np.empty(len(decoded), dtype=object)
    for index, image in enumerate(decoded):
        images[index] = np.zeros((0, 0, channels), np.uint8) if isinstance(image, str) else image
    # An Arrow table, not numpy columns: Ray would type a column of None alone as null, which reads back as NaN.
    return pa.table({"path": pa.array(paths, pa.string()), "image": ArrowTensorArray.from_numpy(images),
                     "error": pa.array([image if isinstance(image, str) else None for image in decoded], pa.string())})
