"""``python -m yolo_fastdetect.bench.val`` (``yolo-fastdetect bench val``): ``model.val`` end to end, stock Ultralytics
against yolo_fastdetect, with the metrics of both.

Per model, a labelled set of ``--images`` JPEGs is made from the wheel's bus.jpg and zidane.jpg (random crops,
mirrors and scales, labelled by the model's own stock predictions: :mod:`._val_dataset`). The model is the
benchmarks' seeded YAML model (:func:`._timing.detecting_model`) with its batch norms calibrated on the wheel's
images, so that its features have a trained model's scale: half precision rounds them as it rounds a trained model's
(with default statistics the head's features are too small for float16 to tell apart, and an fp16 set says nothing),
and its scores spread enough not to tie in float32. Its person and bus logits are scaled (``--logit-scale``) and
biased (``--raised-bias``), the other classes' biased far down (``--background``), so that at conf 0.001 NMS sees
what a trained two-class model gives it (yolov8s.yaml: about 1,400 candidates an image, tens above 0.25)
rather than every anchor of every class, which would make stock's NMS, not the pipeline, the measure. One set serves
both precisions; the model is built afresh for each, since Ultralytics fuses and casts the model it validates in
place. Both sides validate it in one process, toggled with ``yolo_fastdetect.disable()`` / ``enable()``:
``--warmup`` untimed runs then ``--repeats`` timed runs each, stock and ours alternating; each run is a whole
``model.val`` call, as a user makes it (dataset, loader and workers, warm-up, metrics), and the wall time is divided
by the images.

Reported per model and precision: the median wall time per image, the median of Ultralytics' own per-image stage times
(``metrics.speed``: preprocess, inference, postprocess) and what the stages leave out (data loading, set-up, metrics),
and precision, recall, mAP50 and mAP50-95 of both sides as Ultralytics prints them (``%.3g``), with whether every
printed digit is the same. ``--loader-ab`` adds a third side, ours with stock's validation loader
(``YOLO_FASTDETECT_SOURCES=0``), to tell what the threaded loader (``patches/val_loader.py``) gives; ``--without PATCH
...`` another, ours with those patches reverted for its calls: what a change gives, measured on one host. ``--phases``
splits ours' wall time where the threaded loader applies (:class:`LoaderPhases`): the set-up before the loop asks for
its first batch (split at the validator's steps, :data:`SETUP_STEPS`, ms a call), the loop's waits on the loader, the
rest of the loop, and what follows its last batch, with the garbage collector's time in the call and the loop's
time off the CPU on the validator's thread (its waits for the loader and the GIL). Each row also says
what the rest of the host did during its timed runs (:mod:`._host`: other processes' CPU, stolen time). ``--json
PATH`` appends a record per row to PATH as each model's rows end (the format of ``benchmarks/records/``; ``python
benchmarks/render_results.py`` renders them into RESULTS.md).

On a CPU it is a smoke run: stock NMS there takes a second or more for a batch of 32 at conf 0.001, past its own
time limit (``2 + 0.05 * batch`` seconds), after which it drops the batch's remaining images; use small batches.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from unittest import mock

import torch

from ..patches import PATCHES
from ._host import host_activity, host_cpu_times
from ._timing import append_records, detecting_model, environment_line, record_header
from ._val_dataset import write_val_dataset

STAGES = ("preprocess", "inference", "postprocess")
# ``--loader-ab``'s third side: the package on, but the validation set read by stock's DataLoader.
STOCK_LOADER = "ours_stock_loader"
# ``--without``'s side: the package on but for the named patches, reverted for the call (a change's A/B on one host).
WITHOUT = "ours_without"
METRICS = ("P", "R", "mAP50", "mAP50-95")
# How the records' model was prepared, under RESULTS' validation table (earlier records' models were prepared
# otherwise, and say so there).
MODEL_NOTE = ("batch norms calibrated on the wheel's images; person and bus logits scaled {scale} with bias {raised}, "
              "the other classes' bias {background}; Ultralytics' logger {logging}")


def logger_state() -> str:
    """Whether Ultralytics' logger prints INFO lines: with it below INFO, ``fuse_summary`` leaves out the model
    summary's GFLOPs (``patches/fuse_summary.py``), a part of each ``model.val`` call's set-up."""
    from yolo_fastdetect.patches.fuse_summary import summary_is_printed

    return "at INFO" if summary_is_printed() else "below INFO (YOLO_VERBOSE=False)"


def printed(values) -> list[str]:
    """``values`` as Ultralytics' validator prints its metrics (``%11.3g``, without the padding).

    Examples:
        >>> printed([0.50362, 0.27659])
        ['0.504', '0.277']
    """
    return [f"{float(value):.3g}" for value in values]


PHASES = ("set-up", "loader waits", "loop", "after the loop")
# The set-up split at the validator's steps, each ending where the step's method returns (``get_model``, the
# ``AutoBackend`` made, ``get_dataloader``, ``AutoBackend.warmup``) and the last where the loop asks for its first
# batch; a step a release does not take is counted with the next.
SETUP_STEPS = ("model copy", "AutoBackend", "dataset and loader", "warm-up", "to the first batch")


class LoaderPhases:
    """Where one ``model.val`` call's wall time goes, told by its threaded loader
    (:class:`~yolo_fastdetect.sources.dataset_batches.DatasetBatches`): :meth:`seconds` of :data:`PHASES` once the
    call has run inside :meth:`timing`, or None where no such loader was read; :meth:`setup_seconds` splits the
    set-up at :data:`SETUP_STEPS`, and :attr:`gc_seconds` is what Python's garbage collector took in the block (all
    threads; a full collection walks every object of the process). :meth:`loop_off_cpu_seconds` is the loop's wall
    time less the validator's thread's CPU time in it: waits for the loader and for the GIL (CUDA's default
    scheduling spins while the thread waits for the GPU, on the CPU).

    Examples:
        >>> phases = LoaderPhases()
        >>> with phases.timing():  # doctest: +SKIP
        ...     model.val(data="data.yaml", device=0)
        >>> phases.seconds()  # doctest: +SKIP
        {'set-up': 0.071, 'loader waits': 0.163, 'loop': 0.242, 'after the loop': 0.018}
    """

    def __init__(self):
        self.begin = self.end = self.first = self.last = None
        self.waits = self.gc_seconds = 0.0
        self.first_cpu = self.last_cpu = None  # the validator's thread's CPU time (time.thread_time) at first, last
        self.steps: dict[str, float] = {}  # the first time each set-up step ended
        self._collecting: float | None = None  # when the garbage collection under way started

    def _ended(self, step: str, method):
        """``method``, noting when its first call returns as the end of ``step``."""
        phases = self

        @functools.wraps(method)
        def noted(*args, **kwargs):
            try:
                return method(*args, **kwargs)
            finally:
                phases.steps.setdefault(step, time.perf_counter())

        return noted

    def _collected(self, phase: str, info: dict) -> None:
        """A ``gc.callbacks`` entry: the collections' time, start to stop."""
        if phase == "start":
            self._collecting = time.perf_counter()
        elif self._collecting is not None:
            self.gc_seconds += time.perf_counter() - self._collecting
            self._collecting = None

    @contextlib.contextmanager
    def timing(self):
        """Time the block, its set-up steps, its garbage collections, and each batch asked of a threaded loader in
        it."""
        from ultralytics.engine.validator import BaseValidator
        from ultralytics.models.yolo.detect import DetectionValidator
        from ultralytics.nn.autobackend import AutoBackend

        from yolo_fastdetect.sources.dataset_batches import DatasetBatches

        iterate, phases = DatasetBatches.__iter__, self

        def timed(loader):
            batches = iterate(loader)
            try:
                while True:
                    asked = time.perf_counter()
                    if phases.first is None:
                        phases.first, phases.first_cpu = asked, time.thread_time()
                    try:
                        batch = next(batches)
                    except StopIteration:
                        phases.last, phases.last_cpu = time.perf_counter(), time.thread_time()
                        return
                    phases.waits += time.perf_counter() - asked
                    yield batch
            finally:  # also where the caller stops early: the loader's threads end with its iteration
                batches.close()

        steps = [(BaseValidator, "get_model", SETUP_STEPS[0]), (AutoBackend, "__init__", SETUP_STEPS[1]),
                 (DetectionValidator, "get_dataloader", SETUP_STEPS[2]), (AutoBackend, "warmup", SETUP_STEPS[3])]
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(DatasetBatches, "__iter__", timed))
            for owner, name, step in steps:
                if callable(getattr(owner, name, None)):
                    stack.enter_context(mock.patch.object(owner, name, self._ended(step, getattr(owner, name))))
            gc.callbacks.append(self._collected)
            stack.callback(gc.callbacks.remove, self._collected)
            self.begin = time.perf_counter()
            try:
                yield self
            finally:
                self.end = time.perf_counter()

    def seconds(self) -> dict[str, float] | None:
        """The seconds of each of :data:`PHASES`, which add up to the block's; None where no loader was read to its
        end."""
        if self.first is None or self.last is None:
            return None
        loop = self.last - self.first
        values = (self.first - self.begin, self.waits, loop - self.waits, self.end - self.last)
        return dict(zip(PHASES, values))

    def loop_off_cpu_seconds(self) -> float | None:
        """The loop's seconds off the CPU on the validator's thread (wall less thread CPU time, first batch asked to
        the last); None where no loader was read to its end."""
        if self.first is None or self.last is None:
            return None
        return max(0.0, (self.last - self.first) - (self.last_cpu - self.first_cpu))

    def setup_seconds(self) -> dict[str, float] | None:
        """The set-up's seconds at each of :data:`SETUP_STEPS` (together :meth:`seconds`' set-up); None where no
        loader was read."""
        if self.first is None:
            return None
        ends = {**{step: self.steps[step] for step in SETUP_STEPS[:-1] if step in self.steps},
                SETUP_STEPS[-1]: self.first}
        split, since = {}, self.begin
        for step in SETUP_STEPS:
            end = max(since, min(ends.get(step, since), self.first))  # (a step not taken: none)
            split[step], since = end - since, end
        return split


@contextlib.contextmanager
def patches_reverted(names: Sequence[str]) -> Iterator[None]:
    """The named patches reverted in the block, applied again after it (the package on)."""
    chosen = [patch for patch in PATCHES if patch.name in names]
    for patch in reversed(chosen):
        patch.revert()
    try:
        yield
    finally:
        for patch in chosen:
            patch.apply()


def val_once(model, data: Path, options: dict, device: str, side: str,
             phases: LoaderPhases | None = None, without: Sequence[str] = ()) -> tuple[float, object]:
    """One ``model.val`` call with the package off (``side`` "stock") or on (``ours``; :data:`STOCK_LOADER`: with
    ``YOLO_FASTDETECT_SOURCES=0``, so stock's loader reads the set; :data:`WITHOUT`: with the patches named in
    ``without`` reverted): its wall seconds and its metrics; ``phases``, where given, times the call's phases."""
    import yolo_fastdetect

    (yolo_fastdetect.disable if side == "stock" else yolo_fastdetect.enable)()
    with mock.patch.dict(os.environ, {"YOLO_FASTDETECT_SOURCES": "0"} if side == STOCK_LOADER else {}), \
            patches_reverted(without if side == WITHOUT else ()):
        if device != "cpu":
            torch.cuda.synchronize()
        with phases.timing() if phases is not None else contextlib.nullcontext():
            begin = time.perf_counter()
            metrics = model.val(data=str(data), name=side, **options)
            if device != "cpu":
                torch.cuda.synchronize()
            return time.perf_counter() - begin, metrics


def summary(runs: dict, images: int) -> dict:
    """One side's medians: wall ms per image, Ultralytics' stage times per image, the rest of the wall time, and
    with ``--phases`` each of :data:`PHASES` per image (None without)."""
    ms_per_image = statistics.median(runs["wall_s"]) * 1e3 / images
    stage_ms = {stage: statistics.median(speed[stage] for speed in runs["speeds"]) for stage in STAGES}
    phases = {phase: statistics.median(run[phase] for run in runs["phases"]) * 1e3 / images
              for phase in PHASES} if runs["phases"] else None
    setup = {step: statistics.median(run[step] for run in runs["setup"]) * 1e3
             for step in SETUP_STEPS} if runs["setup"] else None
    return {"ms_per_image": ms_per_image, "stages_ms_per_image": stage_ms,
            "rest_ms_per_image": ms_per_image - sum(stage_ms.values()), "metrics": runs["metrics"],
            "phases_ms_per_image": phases, "setup_ms_per_call": setup,
            "gc_ms_per_call": statistics.median(runs["gc_s"]) * 1e3 if runs["gc_s"] else None,
            "loop_off_cpu_ms_per_image": (statistics.median(runs["off_cpu_s"]) * 1e3 / images
                                          if runs["off_cpu_s"] else None)}


def bench_model(name: str, args: argparse.Namespace, folder: Path) -> list[dict]:
    """Stock and ours for one model at each precision, on a set made for it under ``folder``."""
    import yolo_fastdetect

    def calibrated_model():
        return detecting_model(name, logit_scale=args.logit_scale, background=args.background, calibrated=True,
                               raised_bias=args.raised_bias)

    rows = []
    data = write_val_dataset(folder / name, calibrated_model(), args.images, args.imgsz, args.device, args.seed)
    for precision in args.precisions:
        model = calibrated_model()
        options = {"imgsz": args.imgsz, "batch": args.batch, "conf": args.conf, "device": args.device,
                   "quantize": 16 if precision == "fp16" else None, "plots": False, "verbose": False,
                   "project": str(folder / "runs"), "exist_ok": True}
        sides = ("stock", "ours", *([STOCK_LOADER] if args.loader_ab else []), *([WITHOUT] if args.without else []))
        runs = {side: {"wall_s": [], "speeds": [], "phases": [], "setup": [], "gc_s": [], "off_cpu_s": []}
                for side in sides}
        for _ in range(args.warmup):  # the label cache, the workers' first fork, cuDNN's choices, the graphs
            for side in runs:
                val_once(model, data, options, args.device, side, without=args.without or ())
        before = host_cpu_times()
        for _ in range(args.repeats):  # alternating, so that a drift of the machine reaches both sides
            for side in runs:
                phases = LoaderPhases() if args.phases and side == "ours" else None
                seconds, metrics = val_once(model, data, options, args.device, side, phases, args.without or ())
                split = phases.seconds() if phases is not None else None
                if split is not None:
                    runs[side]["phases"].append(split)
                    runs[side]["setup"].append(phases.setup_seconds())
                    runs[side]["gc_s"].append(phases.gc_seconds)
                    runs[side]["off_cpu_s"].append(phases.loop_off_cpu_seconds())
                runs[side]["wall_s"].append(seconds)
                runs[side]["speeds"].append(metrics.speed)
                runs[side]["metrics"] = [float(value) for value in metrics.mean_results()]
        activity = host_activity(before, host_cpu_times())
        yolo_fastdetect.enable()
        row = {"model": name, "images": args.images, "batch": args.batch, "imgsz": args.imgsz,
               "precision": precision, "logit_scale": args.logit_scale, "raised_bias": args.raised_bias,
               "background": args.background, **{side: summary(runs[side], args.images) for side in runs}}
        row["speedup"] = row["stock"]["ms_per_image"] / row["ours"]["ms_per_image"]
        row["without"] = tuple(args.without or ())
        row["host"] = activity
        if activity is not None:
            print(f"  {name} {precision}: the host besides this benchmark, timed runs: {activity.line()}", flush=True)
        if row["ours"]["phases_ms_per_image"]:
            split = ", ".join(f"{phase} {value:.3f}" for phase, value in row["ours"]["phases_ms_per_image"].items())
            print(f"  {name} {precision}: ours' wall time, ms per image: {split}; of the loop, off the CPU "
                  f"{row['ours']['loop_off_cpu_ms_per_image']:.3f} (loader and GIL waits)", flush=True)
            steps = ", ".join(f"{step} {value:.1f}" for step, value in row["ours"]["setup_ms_per_call"].items())
            print(f"  {name} {precision}: ours' set-up, ms a call: {steps}; garbage collection "
                  f"{row['ours']['gc_ms_per_call']:.1f} ms a call", flush=True)
        if args.loader_ab:
            print(f"  {name} {precision}: ours with stock's loader {row[STOCK_LOADER]['ms_per_image']:.3f} ms/img "
                  f"(stages {stages(row[STOCK_LOADER])}), metrics {printed(row[STOCK_LOADER]['metrics'])}", flush=True)
        if args.without:
            print(f"  {name} {precision}: ours without {', '.join(args.without)} {row[WITHOUT]['ms_per_image']:.3f} "
                  f"ms/img (stages {stages(row[WITHOUT])}), metrics {printed(row[WITHOUT]['metrics'])}", flush=True)
        row["same_printed_digits"] = printed(row["stock"]["metrics"]) == printed(row["ours"]["metrics"])
        row["exact"] = row["stock"]["metrics"] == row["ours"]["metrics"]
        rows.append(row)
        print("  " + markdown_table([row]).splitlines()[-1], flush=True)
    return rows


def stages(side: dict) -> str:
    """A side's stage times and rest, ms per image, as the table shows them."""
    times = [*(side["stages_ms_per_image"][stage] for stage in STAGES), side["rest_ms_per_image"]]
    return " / ".join(f"{value:.3f}" for value in times)


def markdown_table(rows: list[dict]) -> str:
    """The rows as a markdown table: times in ms per image, metrics as Ultralytics prints them."""
    lines = [
        "| model | precision | stock ms/img | ours ms/img | speed-up | stock pre / inf / post / rest | "
        "ours pre / inf / post / rest | stock P / R / mAP50 / mAP50-95 | ours P / R / mAP50 / mAP50-95 | "
        "same printed digits (exact) |",
        "|---|---|---:|---:|---:|---|---|---|---|---|",
    ]
    for row in rows:
        stock, ours = row["stock"], row["ours"]
        lines.append(
            f"| {row['model']} | {row['precision']} | {stock['ms_per_image']:.3f} | {ours['ms_per_image']:.3f} | "
            f"{row['speedup']:.2f}x | {stages(stock)} | {stages(ours)} | {' / '.join(printed(stock['metrics']))} | "
            f"{' / '.join(printed(ours['metrics']))} | {'yes' if row['same_printed_digits'] else 'NO'} "
            f"({'yes' if row['exact'] else 'no'}) |"
        )
    return "\n".join(lines)


def records(rows: list[dict], device: str) -> list[dict]:
    """The rows as records of ``benchmarks/records/val.json``."""
    header = record_header("val", "cpu" if device == "cpu" else "gpu")
    made = []
    for row in rows:
        stock, ours = row["stock"], row["ours"]
        figures = {
            "stock_ms_per_image": round(stock["ms_per_image"], 3),
            "ours_ms_per_image": round(ours["ms_per_image"], 3),
            **{f"{side}_stages_ms": [round(row[side]["stages_ms_per_image"][stage], 3) for stage in STAGES]
               + [round(row[side]["rest_ms_per_image"], 3)] for side in ("stock", "ours")},
            "stock_metrics": printed(stock["metrics"]),
            "ours_metrics": printed(ours["metrics"]),
            "same_printed_digits": row["same_printed_digits"],
            "exact": row["exact"],
        }
        if STOCK_LOADER in row:
            figures[f"{STOCK_LOADER}_ms_per_image"] = round(row[STOCK_LOADER]["ms_per_image"], 3)
        if WITHOUT in row:
            figures[f"{WITHOUT}_patches"] = list(row["without"])
            figures[f"{WITHOUT}_ms_per_image"] = round(row[WITHOUT]["ms_per_image"], 3)
            figures[f"{WITHOUT}_stages_ms"] = [round(row[WITHOUT]["stages_ms_per_image"][stage], 3)
                                              for stage in STAGES] + [round(row[WITHOUT]["rest_ms_per_image"], 3)]
        if ours["phases_ms_per_image"]:  # set-up, loader waits, loop, after the loop
            figures["ours_phases_ms"] = [round(value, 3) for value in ours["phases_ms_per_image"].values()]
            figures["ours_setup_ms_per_call"] = [round(value, 1) for value in ours["setup_ms_per_call"].values()]
            figures["ours_gc_ms_per_call"] = round(ours["gc_ms_per_call"], 1)
            figures["ours_loop_off_cpu_ms"] = round(ours["loop_off_cpu_ms_per_image"], 3)
        if row["host"] is not None:
            figures.update(row["host"].figures())
        config = {key: row[key] for key in ("model", "images", "batch", "imgsz", "precision")}
        note = MODEL_NOTE.format(scale=row["logit_scale"], raised=row["raised_bias"], background=row["background"],
                                logging=logger_state())
        made.append({**header, "config": config, "figures": figures, "note": note})
    return made


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; ``argv`` are the options after ``bench val``."""
    parser = argparse.ArgumentParser(prog="yolo-fastdetect bench val", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["yolo12n.yaml", "yolov8s.yaml"])
    parser.add_argument("--images", type=int, default=256, help="images in the generated set (default 256)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--conf", type=float, default=0.001)
    parser.add_argument("--device", default="0", help="cpu, or a CUDA device (default 0)")
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "fp16"),
                        help="default: fp32 and fp16 on a GPU, fp32 on the CPU")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per side first (default 1)")
    parser.add_argument("--logit-scale", type=float, default=2.0,
                        help="the seeded model's class logits scaled by this (default 2)")
    parser.add_argument("--raised-bias", type=float, default=-8.0,
                        help="the seeded model's bias for person and bus (default -8)")
    parser.add_argument("--background", type=float, default=-16.0,
                        help="the seeded model's bias for the other classes (default -16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated images")
    parser.add_argument("--loader-ab", action="store_true",
                        help="also time ours with stock's validation loader (YOLO_FASTDETECT_SOURCES=0)")
    names = [patch.name for patch in PATCHES]
    parser.add_argument("--without", nargs="+", choices=names, metavar="PATCH",
                        help="also time ours with these patches reverted (a change's A/B on one host): "
                        + ", ".join(names))
    parser.add_argument("--phases", action="store_true",
                        help="split ours' wall time at its threaded loader's first and last batch (GPU)")
    parser.add_argument("--json", type=Path, help="append the rows as records to this file (benchmarks/records/)")
    args = parser.parse_args(argv)
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit("bench val needs a CUDA GPU (or --device cpu for a smoke run)")
    args.precisions = args.precisions or (["fp32"] if args.device == "cpu" else ["fp32", "fp16"])
    from .. import _ext

    _ext.require()
    print(f"model.val end to end: {environment_line()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="yfd_bench_val_") as folder:
        for name in args.models:
            made = bench_model(name, args, Path(folder))
            if args.json:  # each model's as it ends: a run stopped by a time limit keeps the models done
                append_records(args.json, records(made, args.device))
            rows += made
    print(f"\nmodel.val on {args.images} generated images, imgsz {args.imgsz}, batch {args.batch}, conf {args.conf}, "
          f"device {args.device}: median of {args.repeats} runs per side after {args.warmup} warm-up; ms per image "
          "(wall: the whole model.val call; stages: Ultralytics' metrics.speed; rest: wall less the stages)\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
