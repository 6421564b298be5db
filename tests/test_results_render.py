"""benchmarks/RESULTS.md is generated: the committed page equals the rendering of benchmarks/records/."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def renderer():
    spec = importlib.util.spec_from_file_location("render_results", REPO / "benchmarks" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_is_the_records_rendering():
    render = renderer()
    expected = render.render(render.load())
    assert (REPO / "benchmarks" / "RESULTS.md").read_text() == expected, (
        "benchmarks/RESULTS.md differs from its records: run python benchmarks/render_results.py")
    assert len(expected.splitlines()) <= 280


def test_records_carry_their_run():
    for path in sorted((REPO / "benchmarks" / "records").glob("*.json")):
        for record in json.loads(path.read_text()):
            assert record["benchmark"] == path.stem
            for key in ("table", "date", "commit", "config", "figures", "torch"):
                assert record.get(key), (path.name, key, record)


def test_the_latest_record_of_a_configuration_wins():
    render = renderer()
    old = {"benchmark": "nms", "table": "gpu", "date": "2026-01-01", "commit": "a", "config": {"batch": 1}}
    new = {**old, "date": "2026-02-01", "commit": "b"}
    other = {**old, "config": {"batch": 2}}
    assert render.current([old, other, new]) == [new, other]
    assert render.current([new, old]) == [new]
