"""README's speed table is generated: it equals the rendering of the current benchmark records, and a row whose
record is missing is left out (with a warning), never filled in."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150


@pytest.fixture
def render_readme(monkeypatch):
    # The renderers are scripts in benchmarks/ (not a package): render_readme imports render_results by name.
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import render_readme

    return render_readme


def test_readme_speed_table_is_the_records_rendering(render_readme):
    text = (REPO / "README.md").read_text()
    block = render_readme.render(render_readme.load())
    assert render_readme.replace_block(text, block) == text, (
        "README.md's speed table differs from its records: run python benchmarks/render_readme.py")
    assert render_readme.main(["--check"]) == 0


def test_every_row_names_a_current_record(render_readme, capsys):
    rows = render_readme.render(render_readme.load()).splitlines()[2:]
    assert len(rows) == len(render_readme.ROWS)
    assert capsys.readouterr().err == ""


def test_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= README_MAX_LINES


def synthetic(date: str, config: dict, stock: float, ours: float) -> dict:
    return {
        "benchmark": "nms", "table": "gpu", "date": date, "commit": "c", "gpu": "GPU X", "ultralytics": "8.9.9",
        "config": config, "figures": {"stock_ms": stock, "ours_ms": ours},
    }


def test_a_missing_record_drops_its_row(render_readme, capsys):
    record, figures, Row = render_readme.record, render_readme.figures, render_readme.Row
    ms = figures("stock_ms", "ms"), figures("ours_ms", "ms")
    rows = [
        Row("both batches", (record("nms", "gpu", batch=1), record("nms", "gpu", batch=64)), *ms),
        Row("a batch never measured", (record("nms", "gpu", batch=1), record("nms", "gpu", batch=8)), *ms),
        Row("batch 64 alone", (record("nms", "gpu", batch=64),), *ms),
    ]
    records = [
        synthetic("2026-01-01", {"batch": 1}, 9.0, 9.0),
        synthetic("2026-01-01", {"batch": 64}, 1234.4, 0.01234),
        synthetic("2026-02-01", {"batch": 1}, 58.449, 0.8),  # the latest record of batch 1 is the one shown
    ]
    assert render_readme.render(records, rows).splitlines() == [
        "| GPU X, fp16 unless noted, both in one process ([runs](benchmarks/RESULTS.md)) | stock Ultralytics 8.9.9 "
        "| yolo_fastdetect |",
        "|---|---|---|",
        "| both batches | 58.4 / 1234 ms | 0.8 / 0.0123 ms |",
        "| batch 64 alone | 1234 ms | 0.0123 ms |",
    ]
    warning = capsys.readouterr().err
    assert "a batch never measured" in warning and "'batch': 8" in warning
    assert "both batches" not in warning


def test_the_markers_must_be_there_once(render_readme):
    with pytest.raises(ValueError, match="markers"):
        render_readme.replace_block("# a README without its speed table\n", "| table |")
    begin, end = render_readme.BEGIN, render_readme.END
    text = f"before\n{begin}\nold\n{end}\nafter\n"
    assert render_readme.replace_block(text, "new") == f"before\n{begin}\nnew\n{end}\nafter\n"



def test_a_row_measured_on_another_gpu_names_it(render_readme):
    records = [{**r, "gpu": "GPU B" if r["benchmark"] == "e2e" else "GPU A"} for r in render_readme.load()]
    header, _, *rows = render_readme.render(records).splitlines()
    assert header.startswith("| GPU A, fp16 unless noted")
    e2e = [row for row in rows if "(GPU B)" in row]
    assert len(e2e) == 2 and "`model.predict` per image" in e2e[0] and "`compile=True`" in e2e[1]
    assert not any("(GPU A)" in row for row in rows)
