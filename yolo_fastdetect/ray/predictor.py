"""The callable class that ``Dataset.map_batches`` runs as long-lived actors: one model load per actor, with the
patch on; a batch of rows (path, or path and bytes, or path and the image decoded ahead) in, a table of detections
(:mod:`.records`) out.

What it guarantees:

- each image's detections are those of ``model.predict(path)`` on that one file, whatever batch Ray puts it in:
  Ultralytics letterboxes a batch with minimal padding only when all its images have one size, so images are
  predicted in groups of one size (a folder of one camera's images stays one batch);
- an image that cannot be read becomes a row with an ``error``, never a failed batch;
- with ``ActorPoolStrategy(max_concurrent_calls_per_actor=2, enable_true_multi_threading=True)`` one batch decodes
  (or, decoded ahead, is fetched and its detections tabled) while the previous one is on the GPU: all but
  ``model.predict`` runs outside the lock that keeps the model to one batch at a time.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa

from . import records
from .decode import decode_rows


def shippable(model):
    """``model`` in a form Ray can send to its actors: a path or name as is, a ``YOLO`` object without its
    predictor (which holds locks and is rebuilt on each actor's first batch). Weights keep their dtype.

    Examples:
        >>> shippable("yolo11n.pt")
        'yolo11n.pt'
    """
    from ultralytics.engine.model import Model

    if isinstance(model, (str, Path)):
        return str(model)
    if not isinstance(model, Model):
        raise TypeError(f"yolo_fastdetect.ray: model must be a path, a model name or an ultralytics YOLO object, "
                        f"got {type(model).__name__}")
    clone = type(model).__new__(type(model))
    clone.__dict__.update({**model.__dict__, "predictor": None, "trainer": None})
    return clone


def input_channels(model) -> int:
    """Image channels ``model`` takes (1 grayscale, 3 BGR), from its YAML; a path or name is loaded for it.

    Examples:
        >>> input_channels("yolo11n.pt")
        3
    """
    from ultralytics import YOLO
    from ultralytics.engine.model import Model

    return (model if isinstance(model, Model) else YOLO(shippable(model))).model.yaml.get("channels", 3)


class Predictor:
    """Detections for the rows of a Ray Data batch, for ``Dataset.map_batches`` (one instance per actor).

    Args:
        model: A weights file or model name/YAML (loaded on each actor), or a ``YOLO`` object (see
            :func:`shippable`).
        device (str, optional): Torch device; default ``cuda:0`` where the actor sees a GPU (Ray gives each actor
            with ``num_gpus=1`` its own as ``cuda:0``), else ``cpu``.
        decode_threads (int, optional): Decoder threads; default
            :func:`yolo_fastdetect.sources.decode_threads`.
        **predict_args: Arguments of ``model.predict`` (``imgsz``, ``conf``, ``iou``, ``quantize``, ``max_det``,
            ``classes``, ...).

    Input rows have a ``path`` column (str) and optionally a ``bytes`` column (the file's content, read there
    instead of the path), or, decoded ahead by :func:`~.decode.decode_batch`, ``image`` and ``error`` columns (then
    nothing is decoded here); output rows are described in :mod:`yolo_fastdetect.ray.records`.

    Examples:
        >>> import ray
        >>> ds = ray.data.from_items([{"path": "bus.jpg"}, {"path": "zidane.jpg"}])
        >>> detections = ds.map_batches(Predictor, fn_constructor_args=("yolo11n.pt",), batch_size=64,
        ...                             num_gpus=1, compute=ray.data.ActorPoolStrategy(size=1))
        >>> detections.write_parquet("detections/")
    """

    def __init__(self, model, device: str | None = None, decode_threads: int | None = None, **predict_args):
        import torch
        from ultralytics import YOLO

        import yolo_fastdetect  # noqa: F401 - importing it patches Ultralytics in this actor's process

        from ..sources import decode_threads as default_threads

        self.model = YOLO(shippable(model))
        task = self.model.task
        keypoint_dims = (self.model.model.yaml.get("kpt_shape") or [0, 3])[1] if task == "pose" else 3
        self.schema = records.schema(task, keypoint_dims)
        self.channels = input_channels(self.model)
        self.threads = decode_threads or default_threads()
        device = device or ("cuda:0" if torch.cuda.is_available() else "cpu")
        self.predict_args = {"verbose": False, **predict_args, "device": device}
        self._on_gpu = not str(device).lower().startswith(("cpu", "mps"))  # "cuda:0", or Ultralytics' "0"
        self._model_lock = threading.Lock()

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        """The detections of ``batch`` (columns ``path``, and optionally ``bytes``, or ``image`` and ``error``), one
        row per input row."""
        paths = [str(path) for path in batch["path"]]
        if "image" in batch:  # decoded ahead: a failed row's image is empty and its error says why
            decoded = [image if error is None else error for image, error in zip(batch["image"], batch["error"])]
        else:
            decoded = decode_rows(paths, batch.get("bytes"), self.channels, self.threads, lower_priority=self._on_gpu)
        by_size = defaultdict(list)  # image shape -> row indices
        for index, image in enumerate(decoded):
            if not isinstance(image, str):
                by_size[image.shape].append(index)
        outcomes = list(decoded)  # each image is replaced by its Results, each error message stays
        with self._model_lock:
            for indices in by_size.values():
                results = self.model.predict([decoded[i] for i in indices], **self.predict_args)
                for index, result in zip(indices, results):
                    outcomes[index] = result
        return records.to_table(paths, outcomes, self.schema)
