"""``predict_dataset``: the common case in one call. Files (or a Ray Dataset of rows) in, a folder of detections
out (Parquet, or JSON lines), one actor per GPU, resumable.

Videos (of a folder, glob, ``.txt`` list or list of paths) run before the images, each video one task of an actor
(:class:`~.videos.VideoPredictor`): one row per frame, and resume skips the videos already in the output.

The work is Ray Data's: ``map_batches`` decodes the files in Ray tasks ahead of the actors
(:func:`~.decode.decode_batch`; or, with ``decode="actor"``, in the actors), runs :class:`~.predictor.Predictor` on
a fixed pool of actors (one per GPU, ``num_gpus=1`` each; or CPU actors), streams batches through them and writes
each finished block as a file. Ray Data restarts an actor that dies and retries its batch there (its defaults for
actor pools: ``max_restarts=-1``, ``max_task_retries=-1``); a batch's rows are written only from a batch that
completed, so an image is neither lost nor written twice. Re-running with the same ``output`` predicts only the
paths not already in it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from .decode import decode_batch
from .predictor import Predictor, input_channels, shippable
from .videos import VideoPredictor

LOGGER = logging.getLogger(__name__)

# Output formats: the suffix Ray Data gives each file, and how a file is read back for resume and the summary.
FORMATS = {"parquet": ".parquet", "json": ".json"}
DECODE = ("tasks", "actor")  # where the files decode: see predict_dataset


@dataclass(frozen=True)
class Summary:
    """What one :func:`predict_dataset` call did.

    Attributes:
        images (int): Images and video frames (rows) written by this call, failures included.
        detections (int): Boxes in those rows.
        failures (int): Rows with an ``error`` (files that were missing or did not decode).
        already_written (int): Rows in the output before this call (resume): their images were not predicted again.
        seconds (float): Wall time of the run, actors' start-up and model loads included.
        actors (int): Model actors it ran (one per GPU when ``gpus``).
        gpus (bool): Whether the actors ran on GPUs.
    """

    images: int
    detections: int
    failures: int
    already_written: int
    seconds: float
    actors: int
    gpus: bool

    @property
    def images_per_second(self) -> float:
        """Images written per second of wall time."""
        return self.images / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        where = f"{self.actors} GPU{'s' * (self.actors > 1)}" if self.gpus else f"{self.actors} CPU actor(s)"
        return (f"{self.images} images ({self.failures} failed), {self.detections} detections in {self.seconds:.1f} s "
                f"({self.images_per_second:.1f} images/s) on {where}; "
                f"{self.already_written} already in the output before")


def source_paths(source: str | Path | list | tuple) -> tuple[list[str], list[str]]:
    """The image files and the video files of ``source``: a folder, a glob, a ``.txt`` list of paths or one file
    (listed as ``model.predict`` lists them, in its order), or a list/tuple of paths (kept as given, videos told by
    their suffix: a missing one becomes an error row).

    Examples:
        >>> source_paths("path/to/folder")
        (['path/to/folder/a.jpg'], ['path/to/folder/clip.mp4'])
    """
    if isinstance(source, (list, tuple)):
        bad = next((item for item in source if not isinstance(item, (str, Path))), None)
        if bad is not None:
            raise TypeError(f"predict_dataset: source list items must be paths (str or Path), got {type(bad).__name__}")
        from ultralytics.data.utils import VID_FORMATS

        paths = [os.fspath(item) for item in source]
        videos = [path for path in paths if path.rpartition(".")[-1].lower() in VID_FORMATS]  # as stock tells them
        return [path for path in paths if path not in set(videos)], videos
    if not isinstance(source, (str, Path)):
        raise TypeError(f"predict_dataset: source must be a folder, glob, .txt list, image path, list of paths or "
                        f"ray.data.Dataset, got {type(source).__name__}")
    from ultralytics.data.loaders import LoadImagesAndVideos

    class Listing(LoadImagesAndVideos):
        def _new_video(self, path: str) -> None:  # list only: a first video that does not open is its own error row
            self.cap = None

    listing = Listing(os.fspath(source))  # stock's listing and its FileNotFoundError for a bad path
    return listing.files[: listing.ni], listing.files[listing.ni :]


def written(output: Path, output_format: str = "parquet") -> pa.Table:
    """Per row already in ``output``: ``path``, ``detections`` (box count) and ``error``. A file that cannot be read
    (a write cut short by a crash) is deleted, with a warning, so that its images are predicted again.

    Examples:
        >>> written(Path("detections/")).num_rows
        1000
    """
    import pyarrow.json
    import pyarrow.parquet

    tables = []
    for file in sorted(output.glob(f"*{FORMATS[output_format]}")):
        try:
            if output_format == "parquet":
                table = pyarrow.parquet.read_table(file, columns=["path", "conf", "error"])
            else:
                table = pyarrow.json.read_json(file).select(["path", "conf", "error"])
        except (pa.ArrowException, OSError, KeyError) as error:
            LOGGER.warning(f"predict_dataset: {file} is unreadable ({error}); deleting it, its images run again")
            file.unlink()
            continue
        tables.append(pa.table({"path": table["path"].cast(pa.string()),
                                "detections": pc.list_value_length(table["conf"]).fill_null(0),
                                "error": table["error"].cast(pa.string())}))
    empty = pa.table({"path": pa.array([], pa.string()), "detections": pa.array([], pa.int32()),
                      "error": pa.array([], pa.string())})
    return pa.concat_tables(tables, promote_options="permissive") if tables else empty


def _counts(table: pa.Table) -> tuple[int, int, int]:
    """Rows, detections and failures of a :func:`written` table."""
    return table.num_rows, int(pc.sum(table["detections"]).as_py() or 0), table.num_rows - table["error"].null_count


def decode_mode(decode: str | None, decode_threads: int | None, cluster_cpus: float, actors: int) -> str:
    """Where :func:`predict_dataset` decodes: ``decode`` as given, or by default ``"tasks"`` where the cluster has a
    CPU beyond the ``actors``' (one each) and ``decode_threads`` is not given, else ``"actor"``. ``"tasks"`` without
    such a CPU is a ValueError: Ray would wait forever for a CPU to run the decode tasks on (a 1-CPU cluster hung).

    Examples:
        >>> decode_mode(None, None, cluster_cpus=16, actors=1), decode_mode(None, None, cluster_cpus=1, actors=1)
        ('tasks', 'actor')
    """
    spare = cluster_cpus - actors >= 1
    if decode is None:
        return "tasks" if spare and decode_threads is None else "actor"
    if decode not in DECODE:
        raise ValueError(f"predict_dataset: decode must be one of {', '.join(DECODE)}, got {decode!r}")
    if decode_threads is not None and decode != "actor":
        raise ValueError(f"predict_dataset: decode_threads is for decode='actor' (decode={decode!r} decodes in Ray "
                         f"tasks of one CPU each), got decode_threads={decode_threads!r}")
    if decode == "tasks" and not spare:
        raise ValueError(f"predict_dataset: decode='tasks' needs a CPU beyond the actors' to decode on (the cluster "
                         f"has {cluster_cpus:g} CPUs for {actors} actor(s) of one CPU each); use decode='actor'")
    return decode


def _summary(before: pa.Table, after: pa.Table, seconds: float, actors: int, gpus: int) -> Summary:
    """What a run added to the output: the :func:`written` tables before and after it."""
    (rows, boxes, failures), (rows_before, boxes_before, failures_before) = _counts(after), _counts(before)
    return Summary(rows - rows_before, boxes - boxes_before, failures - failures_before, rows_before, seconds, actors,
                   bool(gpus))


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"predict_dataset: {name} must be a positive integer, got {value!r}")


def _predict_videos(videos: list[str], model, output: Path, output_format: str, gpus: int, actors: int,
                    batch_size: int, predict_args: dict) -> None:
    """Write the rows of ``videos`` to ``output``: each video one block of one row, one task of a
    :class:`~.videos.VideoPredictor` actor (``batch_size`` frames per forward pass), its rows one block out."""
    import ray.data

    dataset = ray.data.from_blocks([pa.table({"path": pa.array([video], pa.string())}) for video in videos])
    dataset.context.target_max_block_size = None  # a video's rows stay one block, so one file: resume per video
    rows = dataset.map_batches(
        VideoPredictor,
        fn_constructor_args=(model,),
        fn_constructor_kwargs={"device": None if gpus else "cpu", "batch": batch_size, **predict_args},
        batch_size=1,
        batch_format="numpy",
        num_cpus=1,
        num_gpus=1 if gpus else None,
        compute=ray.data.ActorPoolStrategy(size=actors),
    )
    getattr(rows, f"write_{output_format}")(str(output))


def predict_dataset(model, source, output: str | Path, *, batch_size: int = 64, num_gpus: int | None = None,
                    cpu_actors: int = 1, output_format: str = "parquet", decode: str | None = None,
                    decode_threads: int | None = None, **predict_args) -> Summary:
    """Predict every image and video frame of ``source`` on a Ray cluster and write one row per image or frame to
    ``output``.

    Connects to the running cluster (``RAY_ADDRESS``, or a ``ray.init`` already made) or starts a local one.

    ``decode="tasks"`` (the default, where the cluster has a CPU beyond the actors') decodes the files in Ray tasks of
    one CPU each, ahead of the actors: Ray spreads the decoding over every CPU of the cluster (CPU-only nodes included),
    and a GPU actor's process only predicts, its GIL the model's. ``decode="actor"`` decodes in the actor, on
    ``decode_threads`` threads: only paths (or file bytes) travel between processes, not decoded images (several times
    the size of the JPEGs), but the decoder threads share the actor's GIL with its predict thread, which slows the
    actor's ``model.predict`` against a process of its own. Measured on one GPU, tasks ran near ``model.predict`` on
    the same folder and well ahead of decoding in the actor; the cluster's first run, with tasks, was slower (see
    benchmarks/RESULTS.md, Scale-out on Ray Data).

    Args:
        model: A weights file or model name/YAML (every node must be able to read the file), or a ``YOLO`` object.
        source: A folder, glob, ``.txt`` list of paths or image or video file, a list/tuple of paths (videos told
            by their suffix; each video one task, see the module docstring), or a ``ray.data.Dataset`` of images
            with a ``path`` column (and optionally ``bytes``: e.g. ``ray.data.read_binary_files(uri,
            include_paths=True)`` for files that only the cluster can read).
        output: Folder of the results (created; files already there are kept and their images and videos skipped).
        batch_size (int): Images per batch on an actor; a video's frames per forward pass.
        num_gpus (int, optional): GPUs to use, one actor each; default every GPU of the cluster. 0 (or a cluster
            without GPUs): ``cpu_actors`` actors on the CPU.
        cpu_actors (int): Actors when no GPU is used.
        output_format (str): ``"parquet"`` or ``"json"`` (JSON lines).
        decode (str, optional): Where the files decode: ``"tasks"`` (Ray tasks ahead of the actors) or ``"actor"``
            (see above). Default (:func:`decode_mode`): ``"tasks"``, or ``"actor"`` where every CPU of the cluster
            goes to an actor (decode tasks would never run) or ``decode_threads`` is given.
        decode_threads (int, optional): Decoder threads per actor with ``decode="actor"`` (default: the node's
            cores, less one).
        **predict_args: Arguments of ``model.predict`` (``imgsz``, ``conf``, ``iou``, ``quantize``, ...).

    Returns:
        (Summary): Images, detections and failures written by this call, images/s, rows already written.

    Examples:
        >>> summary = predict_dataset("yolo11n.pt", "images/", "detections/", batch_size=64, quantize=16)
        >>> print(summary)
        100000 images (3 failed), 512734 detections in 120.4 s (830.6 images/s) on 1 GPU; 0 already in the output before
    """
    import ray
    import ray.data
    from ultralytics.cfg import get_cfg

    _check_positive("batch_size", batch_size)
    _check_positive("cpu_actors", cpu_actors)
    if num_gpus is not None and (isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0):
        raise ValueError(f"predict_dataset: num_gpus must be a non-negative integer or None, got {num_gpus!r}")
    if output_format not in FORMATS:
        raise ValueError(f"predict_dataset: output_format must be one of {', '.join(FORMATS)}, got {output_format!r}")
    # Bad values fail here, before any work; the default and the check of the CPUs wait for the cluster below.
    decode_mode(decode, decode_threads, cluster_cpus=float("inf"), actors=1)
    get_cfg(overrides=predict_args)  # Ultralytics' own error for an argument it does not know, before any work
    model = shippable(model)
    paths, videos = (None, []) if isinstance(source, ray.data.Dataset) else source_paths(source)

    output = Path(output)
    before = written(output, output_format)
    done = set(before["path"].to_pylist())
    if not ray.is_initialized():
        ray.init()  # reads RAY_ADDRESS; without it, a local cluster of this machine
    resources = ray.cluster_resources()  # a request to the cluster's control store: once
    gpus = int(resources.get("GPU", 0)) if num_gpus is None else num_gpus
    actors = gpus or cpu_actors
    decode = decode_mode(decode, decode_threads, resources.get("CPU", 0), actors)

    begin = time.perf_counter()
    todo_videos = [path for path in videos if path not in done]
    dataset = None
    if paths is None:
        if "path" not in source.columns():
            raise ValueError(f"predict_dataset: a Dataset source needs a 'path' column, got {source.columns()}")
        from ray.data.expressions import col

        dataset = source.filter(expr=col("path").not_in(sorted(done))) if done else source  # vectorised in Arrow
    elif todo := [path for path in paths if path not in done]:
        # One block per batch, of batch_size rows exactly (the last one fewer; from_blocks keeps them as given): a
        # decode task's output block is then an actor's batch as it is, its images read in place from the object
        # store (checked on a local cluster: the batch's memory was the store's /dev/shm mapping). from_items(
        # override_num_blocks=) splits evenly (13 paths at batch 4: 3, 3, 3, 4 rows), and a batch cut across two
        # blocks was a copy in the actor; its default blocks (~10 rows) left most batches short of batch_size, at
        # about half the rate of one block per batch (see benchmarks/RESULTS.md, Scale-out on Ray Data).
        dataset = ray.data.from_blocks([pa.table({"path": pa.array(todo[start:start + batch_size], pa.string())})
                                        for start in range(0, len(todo), batch_size)])
        # No limit on a block's size in this pipeline: Ray splits a block of over 1.5 times its 128 MiB target (a
        # decoded batch of 64 1080p images: 380 MiB) and the actor joined the pieces again, a copy. (Not for a
        # Dataset source: its context is the caller's.)
        dataset.context.target_max_block_size = None

    if todo_videos:
        _predict_videos(todo_videos, model, output, output_format, gpus, actors, batch_size, predict_args)
    if dataset is None:  # no image left to predict
        return _summary(before, written(output, output_format), time.perf_counter() - begin, actors, gpus)
    if decode == "tasks":
        dataset = dataset.map_batches(
            decode_batch,
            # A path loads on the driver for its channels: once, as on an actor. Decoding yields the CPU to a GPU actor,
            # as model.predict's decoder threads yield to its predicting thread (sources.prefetch). Measured no
            # different from without (see benchmarks/RESULTS.md, Scale-out on Ray Data).
            fn_kwargs={"channels": input_channels(model), "lower_priority": bool(gpus)},
            batch_size=batch_size,
            batch_format="numpy",
            num_cpus=1,
            # Ray's default for a CPU task (a worker runs any number of them). Stated, it is an argument that the
            # actor stage lacks, and Ray Data fuses two map stages only of the same arguments: CPU actors ask for
            # what the tasks ask for (num_cpus=1), and without it Ray 2.60 ran ActorPoolMapOperator[
            # MapBatches(decode_batch)->MapBatches(Predictor)], the files decoding in the actor again. (GPU actors
            # differ anyway: num_gpus=1.) tests/test_ray.py checks that no actor decodes.
            max_calls=0,
        )
    detections = dataset.map_batches(
        Predictor,
        fn_constructor_args=(model,),
        # CPU actors on a machine with GPUs must not take one that Ray did not give them.
        fn_constructor_kwargs={"decode_threads": decode_threads, "device": None if gpus else "cpu", **predict_args},
        batch_size=batch_size,
        batch_format="numpy",
        num_cpus=1,
        num_gpus=1 if gpus else None,
        # Two calls per actor, run at once: one batch decodes (or is fetched) while the other holds the model.
        compute=ray.data.ActorPoolStrategy(size=actors, max_concurrent_calls_per_actor=2,
                                           enable_true_multi_threading=True),
    )
    getattr(detections, f"write_{output_format}")(str(output))
    return _summary(before, written(output, output_format), time.perf_counter() - begin, actors, gpus)
