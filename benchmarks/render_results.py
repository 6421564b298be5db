"""Render benchmarks/RESULTS.md (and docs/e2e.png) from the JSON records in benchmarks/records/.

Each record is one measured row: the benchmark and table it belongs to, its date, machine (GPU, host), versions
(torch, CUDA, Ultralytics), commit, configuration and figures. The page shows, for every benchmark and configuration,
the latest record (by date; among records of one date, the last in its file): a new measurement is a new record
appended to its file, and the rows it supersedes stay in git history.

    python benchmarks/render_results.py            # writes benchmarks/RESULTS.md
    python benchmarks/render_results.py --check    # exits 1 if RESULTS.md is not the records' rendering
    python benchmarks/render_results.py --plot     # also re-makes docs/e2e.png (needs matplotlib)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "records"
RESULTS = HERE / "RESULTS.md"
PLOT = HERE.parent / "docs" / "e2e.png"
BENCHMARKS = [
    "parity", "decode", "nms", "roi_align", "sources", "video", "letterbox", "e2e", "val", "scale", "build",
    "versions",
]


def fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return " / ".join(fmt(item) for item in value)
    return str(value)


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else ""


def gain(stock, ours):
    """A rate's speed-up: ours / stock (images per second)."""
    return lambda record: ratio(record["figures"].get(ours), record["figures"].get(stock))


def share(value) -> str:
    return f"{value:.0%}" if isinstance(value, float) else ""


# Per table: (benchmark, table) -> (heading line or None, columns). A column is (header, function of the record).
def config(key):
    return lambda record: fmt(record["config"].get(key))


def figure(key):
    return lambda record: fmt(record["figures"].get(key))


VERSION_COLUMNS = [
    ("Ultralytics", config("release")),
    ("patches off", figure("patches_off")),
    ("checks equal to stock", figure("checks_passed")),
    ("seconds", figure("seconds")),
]

def speedup(stock, ours):
    return lambda record: ratio(record["figures"].get(stock), record["figures"].get(ours))


def without_patches(record) -> str:
    """``bench val --without``'s side: its ms per image and the patches it reverted (blank where not run)."""
    figures = record["figures"]
    if "ours_without_ms_per_image" not in figures:
        return ""
    return f"{figures['ours_without_ms_per_image']} (without {', '.join(figures['ours_without_patches'])})"


def host_activity(record) -> str:
    """What the rest of the host did during the timed runs (recorded from 2026-12-07 on; blank before)."""
    figures = record["figures"]
    if "host_other_cores" not in figures:
        return ""
    return f"{figures['host_other_cores']:.2f} / {figures['host_steal_percent']:.1f}"


def run(record) -> str:
    return f"{record['date']} {record['commit']}"


def build_time(record) -> str:
    figures = record["figures"]
    command = f" ({figures['build_command_s']} s for `yolo-fastdetect build`)" if "build_command_s" in figures else ""
    return f"{figures['build_s']} s{command}"


def slowest_file(record) -> str:
    figures = record["figures"]
    return f"`{figures['slowest_file']}` {figures['slowest_file_s']} s" if "slowest_file" in figures else "-"


def first_prediction(record) -> str:
    figures = record["figures"]
    return (
        f"{figures['first_prediction_s']} s"
        if "first_prediction_s" in figures
        else figures.get("first_prediction", "-")
    )


SOURCE_COLUMNS = [
    ("source", config("source")),
    ("batch", config("batch")),
    ("stock img/s", figure("stock_img_s")),
    ("ours img/s", figure("ours_img_s")),
    ("speed-up", gain("stock_img_s", "ours_img_s")),
    ("decode-only img/s", figure("decode_only_img_s")),
    ("in-memory img/s", figure("in_memory_img_s")),
    ("same paths, counts", figure("same_paths_counts")),
    ("max box diff (px)", figure("max_box_diff_px")),
]
VAL_COLUMNS = [
    ("model", config("model")),
    ("precision", config("precision")),
    ("images, batch, imgsz", lambda r: f"{r['config']['images']}, {r['config']['batch']}, {r['config']['imgsz']}"),
    ("stock ms/img", figure("stock_ms_per_image")),
    ("ours ms/img", figure("ours_ms_per_image")),
    ("speed-up", speedup("stock_ms_per_image", "ours_ms_per_image")),
    ("ours, stock's loader ms/img", figure("ours_stock_loader_ms_per_image")),
    ("ours without patches ms/img", without_patches),
    ("stock pre / inf / post / rest", figure("stock_stages_ms")),
    ("ours pre / inf / post / rest", figure("ours_stages_ms")),
    ("stock P / R / mAP50 / mAP50-95", figure("stock_metrics")),
    ("ours P / R / mAP50 / mAP50-95", figure("ours_metrics")),
    ("same printed digits", figure("same_printed_digits")),
    ("host: other processes' cores / % stolen", host_activity),
]
SCALE_COLUMNS = [
    ("decode", config("decode")),
    ("images, batch", lambda r: f"{r['config']['images']}, {r['config']['batch']}"),
    ("model.predict img/s", figure("predict_img_s")),
    ("predict_dataset img/s (wall)", figure("wall_img_s")),
    ("(steady)", figure("steady_img_s")),
    ("steady / predict", lambda r: f"{r['figures']['steady_img_s'] / r['figures']['predict_img_s']:.0%}"),
    ("fixed cost (s)", figure("fixed_cost_s")),
    ("same paths, counts", figure("same_paths_counts")),
    ("max box diff (px)", figure("max_box_diff_px")),
]


def frame_rate(key):
    """Frames per second, or where the record's side is a latency, its median / p95 ms."""
    def cell(record):
        value = record["figures"].get(key)
        return f"{value:.0f}" if isinstance(value, (int, float)) else "-"
    return cell


def video_side(rate_key, latency_key):
    """A side of the video table: its frames per second, or in the live row its latency (median / p95 ms)."""
    def cell(record):
        latency = record["figures"].get(latency_key)
        return f"{latency[0]:.1f} / {latency[1]:.1f} ms" if latency else frame_rate(rate_key)(record)
    return cell


def cv2_ceiling(record) -> str:
    figures, streams = record["figures"], record["config"]["streams"]
    if "cv2_processes_decode_fps" in figures:
        return (f"{figures['cv2_threads_decode_fps']:.0f} ({streams} threads), "
                f"{figures['cv2_processes_decode_fps']:.0f} ({streams} processes)")
    return frame_rate("cv2_decode_fps")(record)


def video_shares(record) -> str:
    """Ours as a share of its path's decode-only ceiling: cv2 reading against cv2 (in processes where measured), PyAV's
    planes and NVDEC against themselves alone."""
    figures = record["figures"]
    cpu_ceiling = figures.get("cv2_processes_decode_fps", figures.get("cv2_decode_fps"))
    shares = [f"{name} {figures[ours] / ceiling:.0%}" for name, ours, ceiling in
              (("cv2", "ours_cpu_fps", cpu_ceiling), ("PyAV", "ours_pyav_fps", figures.get("pyav_decode_fps")),
               ("NVDEC", "ours_nvdec_fps", figures.get("nvdec_decode_fps")))
              if ours in figures and ceiling]
    return ", ".join(shares) or "-"


def video_clips(record) -> str:
    config = record["config"]
    if config["scenario"] == "live_latency":
        return f"{config['size']}, {config['frames']} frames at {record['figures']['source_fps']:.0f} FPS"
    return f"{config['streams']}x {config['size']}, {config['frames']} frames"


VIDEO_COLUMNS = [
    ("scenario", config("scenario")),
    ("clips", video_clips),
    ("batch", config("batch")),
    ("stock", video_side("stock_fps", "stock_latency_ms")),
    ("ours cv2", video_side("ours_cpu_fps", "ours_latency_ms")),
    ("ours PyAV planes", frame_rate("ours_pyav_fps")),
    ("ours NVDEC", frame_rate("ours_nvdec_fps")),
    ("cv2 decode-only", cv2_ceiling),
    ("PyAV planes decode-only", frame_rate("pyav_decode_fps")),
    ("NVDEC decode-only", frame_rate("nvdec_decode_fps")),
    ("ours / decode-only", video_shares),
    ("same counts cv2 / PyAV / NVDEC", lambda r: fmt([r["figures"].get(f"same_detections_{side}", "-")
                                                      for side in ("cpu", "pyav", "nvdec")])),
]

TABLES = {
    ("parity", "gpu"): (
        "`model.predict` of 16 images made from the wheel's two (scaled 0.5-1.2, every third mirrored), seeded "
        "yolov8s.yaml with raised class biases, stock (package disabled) against everything on, one process; an "
        "image differs if any box, score or class is not bit for bit stock's. Stock against itself: 0 in every row.",
        [
            ("mode", config("mode")),
            ("batch", config("batch")),
            ("conf", config("conf")),
            ("images differing", figure("images_differing")),
            ("box counts differing", figure("counts_differing")),
            ("max box diff (px)", figure("max_box_diff_px")),
            ("boxes (stock)", figure("boxes_stock")),
        ],
    ),
    ("decode", "gpu"): (
        "yolo12n head at 640x640 (8400 anchors, nc=80), ms per call: eager columns time 20 back-to-back "
        "calls (launch overhead included), `(graph)` columns replay them from a CUDA graph (GPU time); "
        "floor = bytes moved / measured copy bandwidth.",
        [
            ("batch", config("batch")),
            ("dtype", config("dtype")),
            ("stock `_inference`", figure("stock_ms")),
            ("ours (op)", figure("ours_op_ms")),
            ("patched `_inference`", figure("patched_ms")),
            ("torch.compile(stock)", figure("compiled_stock_ms")),
            ("stock (graph)", figure("stock_graph_ms")),
            ("ours (graph)", figure("ours_graph_ms")),
            ("floor", figure("floor_ms")),
        ],
    ),
    ("decode", "cpu"): (
        "On a CPU (`bench decode --device cpu`, fp32, wall clock, 8 input sets rotated), ms:",
        [
            ("batch", config("batch")),
            ("stock `_inference`", figure("stock_ms")),
            ("ours (op)", figure("ours_op_ms")),
            ("patched `_inference`", figure("patched_ms")),
        ],
    ),
    ("decode", "half"): (
        "Half precision, the operator alone against stock: the fused decode rounds where stock's ops round (`tests/"
        "test_decode_half_rounding.py`, on the same logits). The bin sum of stock's DFL is a convolution whose order "
        "is its own (cuDNN's on a GPU), so a few boxes move by one half ulp of a distance; scores equal stock's. On a "
        "GPU the patch runs stock's DFL module before the operator, and is exact (Parity, above).",
        [
            ("device", config("device")),
            ("dtype", config("dtype")),
            ("case", config("case")),
            ("boxes differing", figure("boxes_differing")),
            ("largest difference (px)", figure("largest_difference_px")),
            ("scores", figure("scores")),
        ],
    ),
    ("nms", "gpu"): (
        "`non_max_suppression` on `(B, 84, 8400)` fp16 predictions, ms; same detections compares the kept rows.",
        [
            ("batch", config("batch")),
            ("candidates/image", config("candidates")),
            ("settings", config("settings")),
            ("stock", figure("stock_ms")),
            ("ours", figure("ours_ms")),
            ("speed-up", speedup("stock_ms", "ours_ms")),
            ("same detections", figure("same_detections")),
        ],
    ),
    ("nms", "cpu"): (
        "On a CPU (fp32, as Ultralytics predicts there), ms, two runs each (first / second):",
        [
            ("batch", config("batch")),
            ("candidates/image", config("candidates")),
            ("stock", figure("stock_ms")),
            ("ours", figure("ours_ms")),
            ("same detections", figure("same_detections")),
        ],
    ),
    ("nms", "predict"): (
        "`model.predict` of 64 images, batch 64, seeded yolo11n.yaml, fp16: Ultralytics' stage times per "
        "image (ms), both in one run.",
        [
            ("NMS", config("nms")),
            ("preprocess", figure("preprocess_ms")),
            ("inference", figure("inference_ms")),
            ("postprocess", figure("postprocess_ms")),
            ("detections", figure("detections")),
        ],
    ),
    ("roi_align", "gpu"): (
        "1000 RoIs (16-320 px, log-uniform, over a 640x640 input), 7x7 output, sampling ratio 2; each "
        "public call timed on its own (median of 100 after 20 warm-up), ms; torchvision 0.26.",
        [
            ("case", config("case")),
            ("pass", config("pass")),
            ("dtype", config("dtype")),
            ("torchvision", figure("torchvision_ms")),
            ("yolo_fastdetect", figure("ours_ms")),
            ("speed-up", speedup("torchvision_ms", "ours_ms")),
        ],
    ),
    ("sources", "gpu"): (
        "`model.predict(source, stream=True)`, seeded yolov8s.yaml (~200-300 boxes an image), fp16: 256 "
        "JPEGs from 640x480 to 4K; images per second, median of the passes after an untimed one (videos: "
        "Video, below). Ceiling: min(decode-only, in-memory).",
        [("setting", config("setting"))] + SOURCE_COLUMNS,
    ),
    ("sources", "memory"): (
        "Peak host memory loading a list of paths (640x480), MB; the imports alone are the floor:",
        [
            ("paths", config("paths")),
            ("stock MB", figure("stock_mb")),
            ("ours MB", figure("ours_mb")),
            ("imports alone MB", figure("imports_mb")),
        ],
    ),
    ("video", "gpu"): (
        "Generated H.264 clips (a camera's pan and zoom), seeded yolov8s.yaml, fp16; frames per second (live: ms "
        "from release to boxes, median / p95), medians of 3 passes after one unless noted; decode-only ceilings of "
        "the same run.",
        VIDEO_COLUMNS,
    ),
    ("video", "cpu"): ("On a CPU (a smoke run):", VIDEO_COLUMNS),
    ("letterbox", "gpu"): (
        "Stock `LetterBox` + `preprocess` against `ops.letterbox` (one launch per batch of mixed sizes), "
        "bus.jpg / zidane.jpg alternating, ms per batch (median of 15 after 3 warm-up).",
        [
            ("batch", config("batch")),
            ("dtype", config("dtype")),
            ("stock ms", figure("stock_ms")),
            ("ours ms", figure("ours_ms")),
            ("speed-up", speedup("stock_ms", "ours_ms")),
            ("bit-identical", figure("bit_identical")),
        ],
    ),
    ("e2e", "gpu"): (
        "`model.predict` on numpy images (bus/zidane), fp16, stock against everything on, one process; wall ms per "
        "image (CUDA events), stages from `Results.speed`; seeded YAML models, 300 boxes an image; warm-up: first "
        "calls.",
        [
            ("model", config("model")),
            ("batch", config("batch")),
            ("setting", config("setting")),
            ("stock ms/img", figure("stock_ms_per_image")),
            ("ours ms/img", figure("ours_ms_per_image")),
            ("speed-up", speedup("stock_ms_per_image", "ours_ms_per_image")),
            ("stock pre / inf / post", figure("stock_stages_ms")),
            ("ours pre / inf / post", figure("ours_stages_ms")),
            ("warm-up s stock / ours", figure("warmup_s")),
            ("boxes stock / ours", figure("boxes")),
            ("max box diff (px)", figure("max_box_diff_px")),
        ],
    ),
    ("val", "gpu"): (
        "`model.val` on a generated labelled set (crops of the wheel's images, labelled by the model's stock "
        "predictions at conf 0.25), conf 0.001, seeded YAML models (notes under the table); stock against "
        "everything on, one process; wall ms per image of a whole `model.val` call, stages from `metrics.speed`, "
        "rest = wall less the stages. Metrics as Ultralytics prints them.",
        VAL_COLUMNS,
    ),
    ("val", "cpu"): ("On a CPU (a smoke run: stock NMS at conf 0.001 is slow there):", VAL_COLUMNS),
    ("scale", "gpu"): (
        "`predict_dataset` on a local Ray cluster against `model.predict(folder, stream=True)`, same JPEGs, "
        "model and arguments (seeded yolov8s.yaml, imgsz 640, fp16). Wall: images over the whole run "
        "(actors' start-up included); steady: from the actor's own batch times. Warm runs: the cluster's "
        "first run is left out.",
        SCALE_COLUMNS,
    ),
    ("scale", "cpu"): ("On a 2-core CPU, one CPU actor, yolo11n.yaml at imgsz 320:", SCALE_COLUMNS),
    ("build", "build"): (
        "A cold cache each time; `TORCH_CUDA_ARCH_LIST=9.0a`. PyPI toolkit: the `[cuda]` extra's wheels "
        "alone, the system toolkit hidden.",
        [
            ("toolkit", config("toolkit")),
            ("build (14 files, ninja, 16 cores)", build_time),
            ("slowest file", slowest_file),
            ("time to first prediction", first_prediction),
        ],
    ),
    ("versions", "gpu"): (
        "Each release installed alone, stock against patched on seeded YAML models (YOLOv8, YOLO11, YOLO12 where "
        "the release has it, a Segment and a Pose model) at conf 0.25 and 0.001, batch 1 and mixed sizes, a folder "
        "and a list of paths, `val`; on the GPU the patched side runs three times (eager, capture, replay). "
        "detect_head, nms and predictor are on for every release; the patches off say why. Speed per release "
        "is not measured yet. CI runs the same checks on the CPU for 8.3.0, 8.3.100, 8.3.200, 8.3.253, 8.4.0, "
        "8.4.100 and 8.4.190.",
        VERSION_COLUMNS,
    ),
}

SECTIONS = {
    "parity": "Parity in the modes users run (`bench parity`)",
    "decode": "Detect-head decode (`bench decode`)",
    "nms": "Batched NMS (`bench nms`)",
    "roi_align": "RoIAlign (`bench roi_align`)",
    "sources": "File sources (`bench sources`)",
    "video": "Video (`bench video`)",
    "letterbox": "Letterbox preprocessing (`bench letterbox`)",
    "e2e": "End to end: `model.predict` (`bench e2e`)",
    "val": "Validation: `model.val` (`bench val`)",
    "scale": "Scale-out on Ray Data (`bench scale`)",
    "build": "First use: building the operators",
    "versions": "Ultralytics releases (`tests/test_versions.py`, `python -m yolo_fastdetect.bench.versions`)",
}


def load(directory: Path = RECORDS) -> list[dict]:
    records = []
    for name in BENCHMARKS:
        path = directory / f"{name}.json"
        if path.exists():
            records.extend(json.loads(path.read_text()))
    return records


def current(records: list[dict]) -> list[dict]:
    """The latest record per benchmark, table and configuration, in the order the configurations first appear."""
    latest: dict[str, dict] = {}
    order: list[str] = []
    for record in records:
        key = json.dumps([record["benchmark"], record["table"], record["config"]], sort_keys=True)
        if key not in latest:
            order.append(key)
            latest[key] = record
        elif record["date"] >= latest[key]["date"]:
            latest[key] = record
    return [latest[key] for key in order]


def natural(record: dict) -> list:
    """Rows in the order of their configuration values, numbers by value (720p before 1080p)."""
    return [
        [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(value))]
        for value in record["config"].values()
    ]


def machine(record: dict) -> str:
    parts = [record.get("gpu") or "no GPU", record.get("host")]
    parts += [
        f"{name} {record[key]}"
        for key, name in (("torch", "torch"), ("cuda", "CUDA"), ("ultralytics", "Ultralytics"))
        if record.get(key)
    ]
    return ", ".join(part for part in parts if part)


def table(rows: list[dict], columns, tagged: bool = False) -> list[str]:
    """The rows as a markdown table; ``tagged``: each run not on :data:`DEFAULT_MACHINE` names its GPU (a table of
    rows from several machines)."""
    headers = [header for header, _ in columns] + ["run"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for record in rows:
        where = f", {record.get('gpu') or 'no GPU'}" if tagged and machine(record) != DEFAULT_MACHINE else ""
        lines.append("| " + " | ".join([get(record) for _, get in columns] + [run(record) + where]) + " |")
    return lines


DEFAULT_MACHINE = "NVIDIA H200, 16 CPU cores, torch 2.11.0+cu130, CUDA 13.0, Ultralytics 8.4.190"
HEADER = (
    "Generated by `python benchmarks/render_results.py` from `benchmarks/records/*.json` (one record per "
    "measured row): the latest row of each benchmark and configuration, with the run (date, commit) it comes "
    "from; earlier rows are in git history. Times in ms unless a column says otherwise; stock Ultralytics and "
    "ours side by side in one process, medians after warm-up. How to run them: README's Benchmarks section; why: "
    "[docs/design.md](../docs/design.md). Machine, unless a table names another: "
    f"{DEFAULT_MACHINE}, Python 3.12."
)


def render(records: list[dict]) -> str:
    rows = current(records)
    lines = ["# Benchmark results", ""] + textwrap.wrap(HEADER, 118) + [""]
    for benchmark in BENCHMARKS:
        section = [row for row in rows if row["benchmark"] == benchmark]
        if not section:
            continue
        lines += [f"## {SECTIONS[benchmark]}"]
        for (name, table_name), (intro, columns) in TABLES.items():
            table_rows = sorted(
                (row for row in section if row["table"] == table_name and name == benchmark), key=natural
            )
            if not table_rows:
                continue
            # One machine other than the default: the intro names it; several: each row's run names its GPU.
            machines = list(dict.fromkeys(machine(row) for row in table_rows))
            where = f" {machines[0]}." if machines != [DEFAULT_MACHINE] and len(machines) == 1 else ""
            lines += textwrap.wrap(intro + where, 118) + [""] + table(table_rows, columns, len(machines) > 1)
            notes: dict[str, list[str]] = {}
            for row in table_rows:
                if row.get("note"):
                    notes.setdefault(row["note"], []).append(run(row))
            if notes:
                lines += [""] + [f"- {', '.join(dict.fromkeys(runs))}: {note}." for note, runs in notes.items()]
            lines.append("")
        if benchmark == "build":
            check = next(row for row in section if row["table"] == "check")
            lines += [
                f"`{check['config']['command']}` with the PyPI toolkit only ({run(check)}):",
                "",
                "```",
                *check["figures"]["output"],
                "```",
                "",
            ]
        if benchmark == "e2e":
            lines += ["![model.predict per stage](../docs/e2e.png)", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def plot(records: list[dict], output: Path = PLOT) -> None:
    """docs/e2e.png from the current eager rows of `bench e2e` that have stage times."""
    sys.path.insert(0, str(HERE))
    from plot_e2e import plot as plot_e2e

    rows = []
    for record in current(records):
        figures = record["figures"]
        if record["benchmark"] != "e2e" or record["config"]["setting"] != "-" or "ours_stages_ms" not in figures:
            continue
        sides = {
            side: {
                "ms_per_image": figures[f"{side}_ms_per_image"],
                "stages_ms_per_image": dict(
                    zip(("preprocess", "inference", "postprocess"), figures[f"{side}_stages_ms"])
                ),
            }
            for side in ("stock", "ours")
        }
        rows.append(
            {
                "model": record["config"]["model"],
                "batch": record["config"]["batch"],
                **sides,
                "speedup": figures["stock_ms_per_image"] / figures["ours_ms_per_image"],
                "machine": machine(record),
                "gpu": record["gpu"].removeprefix("NVIDIA ").split()[0],
            }
        )
    rows.sort(key=lambda row: (row["model"], row["batch"]))
    machines = list(dict.fromkeys(row["machine"] for row in rows))
    environment = machines[0] if len(machines) == 1 else "each panel's GPU as its title names it"
    plot_e2e({"rows": rows, "environment": environment + " (runs: benchmarks/RESULTS.md)"}, output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if RESULTS.md differs from the rendering")
    parser.add_argument("--plot", action="store_true", help="also re-make docs/e2e.png from the e2e records")
    args = parser.parse_args(argv)
    records = load()
    text = render(records)
    if args.check:
        if RESULTS.read_text() != text:
            print("benchmarks/RESULTS.md is not the records' rendering: run python benchmarks/render_results.py")
            return 1
        return 0
    RESULTS.write_text(text)
    print(f"wrote {RESULTS}")
    if args.plot:
        plot(records)
        print(f"wrote {PLOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
