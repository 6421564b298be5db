"""Ultralytics ``Results`` as rows of an Arrow table: one row per image or video frame, its boxes as list columns.

One row per image (not per box) keeps images without detections and images that failed in the output, which is
what resume and the summary count. The columns, in order:

- ``path`` (string), ``frame`` (int32: a video frame's index, from 1, as stock's ``frame f/F``; null for an image
  and for a video that could not be read), ``width`` and ``height`` (int32: the original image's size; null when it
  did not decode);
- ``xyxy`` (list of [x1, y1, x2, y2] float32, in original-image pixels), ``conf`` (list of float32), ``class_id``
  (list of int32) and ``class_name`` (list of string), one entry per box, in ``Results.boxes`` order;
- Pose models: ``keypoints``, per box a list of the model's ``kpt_shape[0]`` points [x, y(, visibility)];
- Segment models: ``polygons``, per box the mask's outline (``Results.masks.xy``), a list of [x, y] points;
- ``error`` (string): null, or why the image has no detections (not found, not decodable).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

SUPPORTED_TASKS = ("detect", "segment", "pose")  # OBB's rotated boxes and classification have no columns yet

_POINTS = pa.list_(pa.list_(pa.float32(), 2))  # one polygon: a list of [x, y]


def schema(task: str, keypoint_dims: int = 3) -> pa.Schema:
    """The output table's schema for a model of ``task`` (``keypoint_dims``: 2 or 3, Pose models only).

    Examples:
        >>> schema("detect").names
        ['path', 'frame', 'width', 'height', 'xyxy', 'conf', 'class_id', 'class_name', 'error']
    """
    if task not in SUPPORTED_TASKS:
        raise ValueError(f"yolo_fastdetect.ray: model task {task!r} is not supported (supported: "
                         f"{', '.join(SUPPORTED_TASKS)})")
    fields = [("path", pa.string()), ("frame", pa.int32()), ("width", pa.int32()), ("height", pa.int32()),
              ("xyxy", pa.list_(pa.list_(pa.float32(), 4))), ("conf", pa.list_(pa.float32())),
              ("class_id", pa.list_(pa.int32())), ("class_name", pa.list_(pa.string()))]
    if task == "pose":
        fields.append(("keypoints", pa.list_(pa.list_(pa.list_(pa.float32(), keypoint_dims)))))
    if task == "segment":
        fields.append(("polygons", pa.list_(_POINTS)))
    return pa.schema([*fields, ("error", pa.string())])


def _lists(lengths: Sequence[int], values: pa.Array) -> pa.ListArray:
    """``values`` cut into consecutive lists of ``lengths``."""
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _points(arrays: Sequence[np.ndarray], dims: int) -> pa.ListArray:
    """Each ``(n_i, dims)`` array as a list of fixed-size [x, y, ...] points."""
    flat = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0)
    return _lists([len(a) for a in arrays], pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), dims))


def to_table(paths: Sequence[str], outcomes: Sequence, table_schema: pa.Schema,
             frames: Sequence[int | None] | None = None) -> pa.Table:
    """One row per path: its ``Results`` (on any device), or the error message (str) that replaced it; ``frames``:
    each row's frame index (a video's rows), default none (images).

    Examples:
        >>> to_table(["a.jpg"], ["file not found: a.jpg"], schema("detect")).column("error")[0].as_py()
        'file not found: a.jpg'
    """
    results = [None if isinstance(outcome, str) else outcome for outcome in outcomes]
    boxes = [r.boxes.cpu().numpy() for r in results if r is not None]
    counts = [len(r.boxes) if r is not None else 0 for r in results]
    xyxy = np.concatenate([b.xyxy for b in boxes]) if boxes else np.zeros((0, 4))
    conf = np.concatenate([b.conf for b in boxes]) if boxes else np.zeros(0)
    class_id = np.concatenate([b.cls for b in boxes]).astype(np.int32) if boxes else np.zeros(0, np.int32)
    names = [r.names for r in results if r is not None for _ in range(len(r.boxes))]
    columns = {
        "path": pa.array(paths, pa.string()),
        "frame": pa.array(frames if frames is not None else [None] * len(paths), pa.int32()),
        "width": pa.array([r.orig_shape[1] if r is not None else None for r in results], pa.int32()),
        "height": pa.array([r.orig_shape[0] if r is not None else None for r in results], pa.int32()),
        "xyxy": _lists(counts, pa.FixedSizeListArray.from_arrays(pa.array(xyxy.reshape(-1), pa.float32()), 4)),
        "conf": _lists(counts, pa.array(conf, pa.float32())),
        "class_id": _lists(counts, pa.array(class_id, pa.int32())),
        "class_name": _lists(counts, pa.array([n[c] for n, c in zip(names, class_id.tolist())], pa.string())),
        "error": pa.array([outcome if isinstance(outcome, str) else None for outcome in outcomes], pa.string()),
    }
    if "keypoints" in table_schema.names:
        dims = table_schema.field("keypoints").type.value_type.value_type.list_size
        per_box = [k for r in results if r is not None for k in r.keypoints.data.cpu().numpy()]
        columns["keypoints"] = _lists(counts, _points(per_box, dims))
    if "polygons" in table_schema.names:
        per_box = [p for r in results if r is not None for p in (r.masks.xy if r.masks is not None else [])]
        columns["polygons"] = _lists(counts, _points(per_box, 2))
    return pa.Table.from_arrays([columns[name] for name in table_schema.names], schema=table_schema)
