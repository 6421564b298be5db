"""Videos in ``predict_dataset``: each video one Ray Data row, read in an actor as ``model.predict`` reads that video
alone, into one output row per frame.

A video is one task: its frames decode in the actor (the patched loader's reader thread, :mod:`yolo_fastdetect.
sources`), in stock's order, and its rows leave the actor together, in one block, so that an output file holds all of
a video's rows or none: resume works at video granularity. A video that cannot be read (missing, not a video) or
has no frame gives one row with its ``error``; one that fails part-way keeps the rows of the frames read, then such a
row.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from . import records
from .predictor import Predictor

ROWS_PER_CHUNK = 64  # frames turned into rows at once: a long video's Results (each holds its image) are not kept


class VideoPredictor(Predictor):
    """Detections for the videos of a Ray Data batch (a ``path`` column), for ``Dataset.map_batches``: per video,
    one row per frame (its ``frame`` index from 1, as stock's ``frame f/F`` with ``vid_stride`` applied), in order.

    Args:
        model: As :class:`~.predictor.Predictor` takes it.
        device (str, optional): As :class:`~.predictor.Predictor` takes it.
        batch (int): Frames per forward pass, as ``model.predict(video, batch=...)``.
        **predict_args: Arguments of ``model.predict`` (``imgsz``, ``conf``, ``vid_stride``, ...).

    Examples:
        >>> import ray
        >>> ds = ray.data.from_items([{"path": "a.mp4"}, {"path": "b.mp4"}])
        >>> rows = ds.map_batches(VideoPredictor, fn_constructor_args=("yolo11n.pt",), batch_size=1,
        ...                       compute=ray.data.ActorPoolStrategy(size=1))
    """

    def __init__(self, model, device: str | None = None, batch: int = 16, **predict_args):
        super().__init__(model, device=device, **predict_args)
        self.predict_args["batch"] = batch

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        """The rows of every video of ``batch``, video after video."""
        return pa.concat_tables([table for path in batch["path"] for table in self._video(str(path))])

    def _video(self, path: str) -> list[pa.Table]:
        """One video's rows, in chunks of at most :data:`ROWS_PER_CHUNK`."""
        tables, results = [], []
        try:
            with self._model_lock:
                for result in self.model.predict(path, stream=True, **self.predict_args):
                    results.append(result)
                    if len(results) == ROWS_PER_CHUNK:
                        tables.append(self._rows(path, results, first=len(tables) * ROWS_PER_CHUNK + 1))
                        results = []
        except Exception as error:  # noqa: BLE001 - the video's error row, not a failed job
            if results:
                tables.append(self._rows(path, results, first=len(tables) * ROWS_PER_CHUNK + 1))
            reason = "file not found" if not os.path.isfile(path) else f"video read error: {type(error).__name__}"
            tables.append(records.to_table([path], [f"{reason}: {path}: {error}"], self.schema, [None]))
            return tables
        if results:
            tables.append(self._rows(path, results, first=len(tables) * ROWS_PER_CHUNK + 1))
        if not tables:  # opened, but no frame read: a row says so (and marks the video done for resume)
            tables.append(records.to_table([path], [f"video without frames: {path}"], self.schema, [None]))
        return tables

    def _rows(self, path: str, results: list, first: int) -> pa.Table:
        return records.to_table([path] * len(results), results, self.schema, list(range(first, first + len(results))))
