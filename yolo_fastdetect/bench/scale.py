"""``python -m yolo_fastdetect bench scale``: ``predict_dataset`` (Ray Data, one actor per GPU) against plain
``model.predict`` on the same folder, in images per second.

It writes ``--images`` JPEGs of ``--sizes`` (random crops of the wheel's images; ``--keep DIR`` keeps them) and
predicts the folder at ``--batch`` with the same model and arguments (fp16 on CUDA), with the patch on both sides:

- ``model.predict(folder, stream=True)`` in this process: an untimed pass, then the median of ``--repeats``;
- ``predict_dataset`` on a local Ray cluster of this machine (or the one ``RAY_ADDRESS`` names) with ``--gpus``
  actors (one per GPU; CPU actors on ``--device cpu``), into a fresh output folder each time, once per ``--decode``
  mode (``tasks``: the files decode in Ray tasks ahead of the actors; ``actor``: in the actors; both by default, in
  turn within each repeat, for an A/B of one run, after a first run of the cluster left out): its wall rate (actor
  start-up and model load included), and its steady rate, which leaves out that fixed cost: the actor notes when
  each batch's detections are ready (:mod:`._scale_actor`), and the rate is the rows of every batch but the first
  over the time from the first to the last (medians of ``--repeats``). The fixed cost is the run's time less what
  the steady rate takes for its images;
- per mode, the steady rate as a share of ``model.predict``'s (the target: at least 90 % on one GPU, batch 64), and
  whether both wrote the same detections (same paths, box counts per image, largest box distance).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from ._source_data import write_jpegs
from ._timing import detecting_model, environment_line
from .e2e import detection_difference


def predict_rate(model, folder: Path, batch: int, options: dict, repeats: int) -> tuple[float, dict]:
    """Median images/s of ``model.predict(folder, stream=True)`` after an untimed pass; path -> (n, 6) boxes."""
    def one_pass() -> tuple[float, dict]:
        begin = time.perf_counter()
        boxes = {r.path: r.boxes.data.float().cpu() for r in model.predict(str(folder), stream=True, batch=batch,
                                                                            **options)}
        return len(boxes) / (time.perf_counter() - begin), boxes

    one_pass()
    passes = [one_pass() for _ in range(repeats)]
    return statistics.median(rate for rate, _ in passes), passes[-1][1]


def dataset_run(model, source, output: Path, batch: int, gpus: int, decode: str,
                options: dict, times: Path) -> tuple[float, float, dict]:
    """Wall seconds and steady rate (:func:`~._scale_actor.steady_rate`) of one ``predict_dataset(decode=decode)``
    run into the empty folder ``output``, its actors noting their batches in the folder ``times``; path -> (n, 6)
    boxes."""
    import shutil
    from unittest import mock

    import pyarrow.parquet as pq

    from yolo_fastdetect.ray import dataset

    from ._scale_actor import TimedPredictor, steady_rate

    shutil.rmtree(times, ignore_errors=True)
    times.mkdir(parents=True)
    with mock.patch.object(dataset, "Predictor", TimedPredictor):  # what predict_dataset maps the batches with
        summary = dataset.predict_dataset(model, source, output, batch_size=batch, num_gpus=gpus, decode=decode,
                                          **options)
    rows = pq.read_table(output, columns=["path", "xyxy", "conf", "class_id"]).to_pylist()
    boxes = {row["path"]: torch.tensor([[*xyxy, conf, cls] for xyxy, conf, cls in
                                        zip(row["xyxy"], row["conf"], row["class_id"])]).reshape(-1, 6)
             for row in rows}
    return summary.seconds, steady_rate(times), boxes


def compare(ours: dict, stock: dict) -> dict:
    """:func:`detection_difference` of two path -> boxes maps, and whether they hold the same paths."""
    from ultralytics.engine.results import Boxes

    paths = sorted(stock)
    as_results = [[SimpleNamespace(boxes=Boxes(side.get(p, torch.zeros(0, 6)), orig_shape=(1, 1))) for p in paths]
                  for side in (ours, stock)]
    return {**detection_difference(*as_results), "same_paths": sorted(ours) == paths}


def run(args) -> dict:
    import ray
    import ray.data

    cuda = args.device == "cuda"
    options = {"device": args.device, "verbose": False, "imgsz": args.imgsz, "quantize": 16 if cuda else None}
    ray_options = {"imgsz": args.imgsz, "quantize": options["quantize"]}  # predict_dataset picks the devices
    gpus = args.gpus if cuda else 0
    model = detecting_model(args.model)
    with tempfile.TemporaryDirectory(prefix="yfd_bench_scale_") as scratch:
        root = Path(args.keep or scratch)
        sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes]
        write_jpegs(root / "images", args.images, sizes=sizes)
        single, stock = predict_rate(model, root / "images", args.batch, options, args.repeats)
        print(f"  model.predict: {single:.1f} images/s", flush=True)

        from ._scale_actor import TIMES_VARIABLE

        times = root / "times"  # the actors' notes: on this machine, so the cluster is best a local one
        ray.init(num_gpus=gpus if not os.environ.get("RAY_ADDRESS") else None, include_dashboard=False,
                 runtime_env={"env_vars": {TIMES_VARIABLE: str(times)}})
        ray.data.DataContext.get_current().enable_progress_bars = False
        # The cluster's first run, left out of the medians as model.predict's first pass is: it is much slower than
        # the next, and as half of a median it pulled the steady rate well below model.predict's where the second run
        # alone matched it (see benchmarks/RESULTS.md, Scale-out on Ray Data).
        first_seconds, first_steady, _ = dataset_run(model, str(root / "images"), root / "out_first", args.batch,
                                                     gpus, args.decode[0], ray_options, times)
        print(f"  the cluster's first run (decode={args.decode[0]}, not in the medians): {first_seconds:.1f} s, "
              f"{first_steady:.1f} images/s steady", flush=True)
        runs = {decode: {"seconds": [], "steady": []} for decode in args.decode}
        detections = {}
        for repeat in range(args.repeats):
            for decode in args.decode:  # in turn within a repeat: the modes see the same machine, the same caches
                output = root / f"out_{decode}_{repeat}"
                seconds, steady, boxes = dataset_run(model, str(root / "images"), output, args.batch, gpus, decode,
                                                     ray_options, times)
                detections[decode] = compare(boxes, stock)
                runs[decode]["seconds"].append(seconds)
                runs[decode]["steady"].append(steady)
                # Each run as it ends: a call cut short by a time limit keeps what finished (a table printed only at
                # the end was lost with it).
                same = detections[decode]["same_paths"] and detections[decode]["same_counts"]
                print(f"  decode={decode} repeat {repeat + 1}: {seconds:.1f} s, {steady:.1f} images/s steady; same "
                      f"paths and box counts as model.predict: {same}, max box diff "
                      f"{detections[decode]['max_box_diff_px']:.2g} px", flush=True)
    rows = [mode_row(decode, runs[decode], single, detections[decode], args) for decode in args.decode]
    return {"model_predict": single, "rows": rows, "gpus": gpus, "actors": gpus or 1,
            "first_run": {"decode": args.decode[0], "seconds": first_seconds, "steady": first_steady}}


def mode_row(decode: str, runs: dict, single: float, detections: dict, args) -> dict:
    """One ``--decode`` mode's rates from its runs (``seconds`` and ``steady``, per repeat)."""
    seconds, steady = statistics.median(runs["seconds"]), statistics.median(runs["steady"])
    print(f"  predict_dataset decode={decode}: {args.images / seconds:.1f} images/s wall, {steady:.1f} steady "
          f"(per repeat: {', '.join(f'{rate:.1f}' for rate in runs['steady'])})", flush=True)
    return {"decode": decode, "dataset_wall": args.images / seconds, "dataset_steady": steady,
            "share": steady / single, "fixed_seconds": seconds - args.images / steady, "runs": runs,
            "detections": detections}


def markdown(result: dict, args) -> str:
    where = f"{result['gpus']} GPU actor(s)" if result["gpus"] else "1 CPU actor"
    lines = [
        f"{environment_line()} | {os.cpu_count()} CPUs | model {args.model}, imgsz {args.imgsz}, batch {args.batch} | "
        f"{args.images} JPEGs ({', '.join(args.sizes)}) | {where}",
        "",
        "| decode | model.predict img/s | predict_dataset img/s (wall) | predict_dataset img/s (steady) | "
        "steady / predict | fixed cost (s) | same paths, counts | max box diff (px) |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in result["rows"]:
        detections = row["detections"]
        same = "yes" if detections["same_paths"] and detections["same_counts"] else "NO"
        lines.append(f"| {row['decode']} | {result['model_predict']:.1f} | {row['dataset_wall']:.1f} | "
                     f"{row['dataset_steady']:.1f} | {row['share']:.0%} | "
                     f"{row['fixed_seconds']:.1f} | {same} | "
                     f"{detections['max_box_diff_px']:.2g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="yolov8s.yaml")
    # One GPU actor: 12288 720p images take about as long as the run's fixed cost (see benchmarks/RESULTS.md,
    # Scale-out on Ray Data).
    parser.add_argument("--images", type=int, default=12288)
    parser.add_argument("--sizes", nargs="+", default=["1280x720"], help="image sizes WxH, cycled")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=1, help="GPU actors (CUDA only)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--decode", nargs="+", choices=["tasks", "actor"], default=["tasks", "actor"],
                        help="predict_dataset's decode modes to time, each a row (default: both)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--keep", type=Path, help="write the data here and keep it")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = parser.parse_args(argv)
    args.decode = list(dict.fromkeys(args.decode))  # a mode named twice is one row
    if args.images <= args.batch:
        parser.error(f"--images ({args.images}) must exceed --batch ({args.batch}): the steady rate needs two "
                     f"batches or more")
    result = run(args)
    print(markdown(result, args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
