"""Batch inference over many files on many GPUs and machines, on Ray Data (the optional extra
``yolo-fastdetect[ray]``).

Three pieces, each usable alone:

- :class:`Predictor` (:mod:`.predictor`): the callable class for ``Dataset.map_batches``; one model load per actor
  with the patch on, rows of paths (or file bytes, or images decoded ahead by :func:`decode_batch`) in, rows of
  detections (:mod:`.records`) out;
- :func:`predict_dataset` (:mod:`.dataset`): a folder, glob, list of paths or Dataset in, a folder of Parquet (or
  JSON lines) out, one actor per GPU, resumable, with a :class:`Summary`;
- ``yolo-fastdetect predict-many model=... source=... output=...`` (:mod:`.cli`): the same from the command line.

Examples:
    >>> from yolo_fastdetect.ray import predict_dataset
    >>> print(predict_dataset("yolo11n.pt", "images/", "detections/", batch_size=64, quantize=16))
"""

from __future__ import annotations

from .dataset import Summary, decode_mode, predict_dataset, source_paths, written
from .decode import decode_batch, decode_bytes, decode_rows
from .predictor import Predictor, input_channels, shippable
from .records import SUPPORTED_TASKS, schema, to_table
from .videos import VideoPredictor

__all__ = ["SUPPORTED_TASKS", "Predictor", "Summary", "VideoPredictor", "decode_batch", "decode_bytes", "decode_mode",
           "decode_rows", "input_channels", "predict_dataset", "schema", "shippable", "source_paths", "to_table",
           "written"]
