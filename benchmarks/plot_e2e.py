"""Plot ``bench e2e --json`` results: per-image time of each predict stage, stock against yolo_fastdetect.

One panel per model (rows) and batch size (columns), each with two stacked bars (preprocess, inference,
post-process: Ultralytics' own per-image stage times, medians) and the measured wall time per image above them.

    python benchmarks/plot_e2e.py e2e.json                 # writes docs/e2e.png
    python benchmarks/plot_e2e.py e2e.json --output out.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

STAGES = {"preprocess": "#8fbcd4", "inference": "#1f5f8b", "postprocess": "#f0a35e"}
SIDES = {"stock": "stock", "ours": "yolo_fastdetect"}


def plot(data: dict, output: Path) -> None:
    rows = [row for row in data["rows"] if not (row.get("compile") or row.get("channels_last"))]  # eager rows only
    models = list(dict.fromkeys(row["model"] for row in rows))
    batches = sorted({row["batch"] for row in rows})
    several_gpus = len({row.get("gpu") for row in rows}) > 1  # then each panel names its row's
    figure, axes = plt.subplots(len(models), len(batches), figsize=(3.2 * len(batches), 3.0 * len(models)),
                                squeeze=False)
    for row in rows:
        axis = axes[models.index(row["model"])][batches.index(row["batch"])]
        for position, side in enumerate(SIDES):
            bottom = 0.0
            for stage, colour in STAGES.items():
                height = row[side]["stages_ms_per_image"][stage]
                label = stage if position == 0 else None  # one legend entry per stage
                axis.bar(position, height, bottom=bottom, color=colour, width=0.6, label=label)
                bottom += height
            wall = row[side]["ms_per_image"]
            axis.annotate(f"{wall:.2f} ms", (position, max(bottom, wall)), ha="center", va="bottom", fontsize=8)
        axis.set_xticks(range(len(SIDES)), list(SIDES.values()), fontsize=8)
        gpu = f" ({row['gpu']})" if several_gpus else ""
        axis.set_title(f"{row['model']}, batch {row['batch']}: {row['speedup']:.2f}x{gpu}", fontsize=9)
        axis.set_ylabel("ms per image", fontsize=8)
        axis.margins(y=0.15)
    filled = {(models.index(row["model"]), batches.index(row["batch"])) for row in rows}
    for i, axes_row in enumerate(axes):
        for j, axis in enumerate(axes_row):
            if (i, j) not in filled:
                axis.set_axis_off()  # no measured row with stage times for this model and batch
    first = min(filled)
    handles, labels = axes[first[0]][first[1]].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(STAGES), fontsize=8, frameon=False)
    figure.suptitle(f"model.predict per image, Ultralytics stage times (label: wall time)\n{data['environment']}",
                    fontsize=9)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, help="the file written by `bench e2e --json`")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "e2e.png")
    args = parser.parse_args(argv)
    plot(json.loads(args.json.read_text()), args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
