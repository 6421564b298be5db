"""``bench scale``'s actor: :class:`~yolo_fastdetect.ray.Predictor` that notes when each batch's detections are ready,
so that the benchmark's steady rate is the actor's, not the output writer's.

A module of its own: Ray sends the class to its workers by reference, and only ``bench scale`` imports it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from yolo_fastdetect import config
from yolo_fastdetect.ray.predictor import Predictor

TIMES_VARIABLE = "YOLO_FASTDETECT_BENCH_SCALE_TIMES"  # the folder of the notes (Ray passes it to every worker)


class TimedPredictor(Predictor):
    """:class:`~yolo_fastdetect.ray.Predictor` that, after each batch, writes an empty file named
    ``<seconds since the epoch>_<rows>_<process>_<thread>`` into the folder ``$YOLO_FASTDETECT_BENCH_SCALE_TIMES``
    where this node has that folder (an actor on another machine of a ``RAY_ADDRESS`` cluster notes nothing, rather
    than failing its batch)."""

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        table = super().__call__(batch)
        folder = config.get(TIMES_VARIABLE)
        if folder is not None and folder.is_dir():
            Path(folder, f"{time.time():.6f}_{table.num_rows}_{os.getpid()}_{threading.get_ident()}").touch()
        return table


def steady_rate(folder: Path) -> float:
    """Rows per second the actors finished between their first batch and their last (NaN for fewer than two
    batches): this leaves out the run's start (cluster work, actor start-up, model load, the first batch) and the
    writing of the output after the last batch.

    The steady rate was first a full run less a one-batch run; their fixed costs varied by seconds between runs. The
    output files' times were tried next and came out too high: on 2 CPUs the write tasks, kept from the CPUs by
    decode tasks, wrote the files in a burst after the last batch (see benchmarks/RESULTS.md, Scale-out on Ray Data).

    Examples:
        >>> steady_rate(Path("times"))
        812.5
    """
    notes = sorted((float(seconds), int(rows)) for seconds, rows, *_ in
                   (note.name.split("_") for note in Path(folder).iterdir()))
    if len(notes) < 2 or notes[-1][0] <= notes[0][0]:
        return float("nan")
    return sum(rows for _, rows in notes[1:]) / (notes[-1][0] - notes[0][0])
