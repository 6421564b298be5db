"""``yolo-fastdetect predict-many model=... source=... output=... [key=value ...]``: :func:`predict_dataset` from
the command line, in Ultralytics' ``key=value`` style.

It connects to the running Ray cluster named by ``RAY_ADDRESS`` (e.g. on a cluster's head node after ``ray start
--head``), and starts a local one on this machine otherwise.
"""

from __future__ import annotations

USAGE = """\
usage: yolo-fastdetect predict-many model=MODEL source=SOURCE output=FOLDER [key=value ...]
  Predict every image and video frame of SOURCE (a folder, glob, .txt list of paths, image or video) on Ray, one
  actor per GPU, and write one row per image or frame (path, frame, size, boxes, scores, classes, error) to FOLDER
  as Parquet, each video one task; re-running skips the images and videos already written there.
  RAY_ADDRESS=host:port connects to a running cluster; without it a local one starts.
  keys of its own:
    batch=64          images per batch on an actor (a video's frames per forward pass)
    num_gpus=N        GPUs to use, one actor each (default: all of the cluster; 0: CPU actors)
    cpu_actors=1      actors when no GPU is used
    format=parquet    or json (JSON lines)
    decode=tasks      where the files decode: tasks (Ray tasks of one CPU each, ahead of the actors: decoding
                      on every CPU of the cluster, CPU-only nodes too, and the GPU actors only predict) or actor
                      (in each actor, on its own threads: only paths travel between processes); default tasks,
                      or actor where the actors take every CPU of the cluster or decode_threads is given
    decode_threads=N  decoder threads per actor with decode=actor (default: the node's cores, less one)
  any other key is an argument of model.predict: imgsz=640 conf=0.25 iou=0.7 quantize=16 max_det=300 ...
  e.g. yolo-fastdetect predict-many model=yolo11n.pt source=images/ output=detections/ quantize=16"""

REQUIRED = ("model", "source", "output")
OWN_KEYS = {"batch": "batch_size", "num_gpus": "num_gpus", "cpu_actors": "cpu_actors", "format": "output_format",
            "decode": "decode", "decode_threads": "decode_threads"}


def parse(argv: list[str]) -> dict:
    """``key=value`` arguments as :func:`predict_dataset`'s keyword arguments (values typed as Ultralytics types
    them: ``16`` an int, ``true`` a bool, ``[0, 5]`` a list).

    Examples:
        >>> parse(["model=yolo11n.pt", "source=images", "output=out", "batch=32", "conf=0.5"])
        {'model': 'yolo11n.pt', 'source': 'images', 'output': 'out', 'batch_size': 32, 'conf': 0.5}
    """
    from ultralytics.cfg import smart_value

    arguments = {}
    for argument in argv:
        key, separator, value = argument.partition("=")
        if not separator or not key or not value:
            raise SystemExit(f"predict-many: arguments are key=value, got {argument!r}\n\n{USAGE}")
        # Paths stay strings: smart_value would turn a folder named "1" into an int.
        arguments[OWN_KEYS.get(key, key)] = value if key in REQUIRED else smart_value(value)
    missing = [key for key in REQUIRED if key not in arguments]
    if missing:
        raise SystemExit(f"predict-many: missing {', '.join(f'{key}=' for key in missing)}\n\n{USAGE}")
    return arguments


def main(argv: list[str]) -> None:
    """Run ``predict-many`` with ``argv`` (the arguments after the command's name); print the summary."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    arguments = parse(argv)
    from .dataset import predict_dataset

    try:
        summary = predict_dataset(arguments.pop("model"), arguments.pop("source"), arguments.pop("output"),
                                  **arguments)
    except (FileNotFoundError, TypeError, ValueError, SyntaxError) as error:  # bad input: its message, no trace
        raise SystemExit(f"predict-many: {error}") from None
    print(f"predict-many: {summary}")
