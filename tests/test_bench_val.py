"""``bench val``: a tiny CPU run through the whole benchmark (the benchmark proper needs a GPU), its records, and
their rendering into RESULTS.md."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest

from conftest import HAS_CUDA
from yolo_fastdetect.bench import val
from yolo_fastdetect.sources.dataset_batches import DatasetBatches

REPO = Path(__file__).resolve().parents[1]


def test_printed_as_ultralytics_prints():
    assert val.printed([0.50362, 0.0012345, 1.0, 0.0]) == ["0.504", "0.00123", "1", "0"]


@pytest.mark.skipif(HAS_CUDA, reason="checks the message given without a GPU")
def test_needs_a_gpu():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        val.main([])


def test_the_third_side_reads_with_stocks_loader(monkeypatch):
    """``--loader-ab``'s side runs with the package on and ``YOLO_FASTDETECT_SOURCES=0``, the others without it."""
    import yolo_fastdetect

    seen = []

    class Model:
        def val(self, **options):
            seen.append((options["name"], yolo_fastdetect.is_enabled(), os.environ.get("YOLO_FASTDETECT_SOURCES")))
            return "metrics"

    monkeypatch.delenv("YOLO_FASTDETECT_SOURCES", raising=False)
    for side in ("stock", "ours", val.STOCK_LOADER):
        seconds, metrics = val.val_once(Model(), Path("data.yaml"), {}, "cpu", side)
        assert seconds >= 0 and metrics == "metrics"
    yolo_fastdetect.enable()
    assert seen == [("stock", False, None), ("ours", True, None), (val.STOCK_LOADER, True, "0")]
    assert "YOLO_FASTDETECT_SOURCES" not in os.environ


def test_phases_split_a_call_at_its_loaders_first_and_last_batch():
    """Set-up until the first batch is asked for, the waits for batches, the rest of the loop, and what follows the
    last batch: each at least what the block spent there, together the block's wall time."""
    class SlowSamples:
        def __getitem__(self, index):
            time.sleep(0.01)
            return index

    phases = val.LoaderPhases()
    with phases.timing():
        time.sleep(0.05)  # set-up
        loader = DatasetBatches(SlowSamples(), [[0, 1], [2, 3], [4, 5]], list, threads=1, read_ahead=1)
        assert [batch for batch in loader if time.sleep(0.02) is None] == [[0, 1], [2, 3], [4, 5]]
        time.sleep(0.03)  # the metrics
    seconds = phases.seconds()
    assert list(seconds) == list(val.PHASES)
    assert seconds["set-up"] >= 0.05 and seconds["after the loop"] >= 0.03 and seconds["loop"] >= 3 * 0.02
    assert seconds["loader waits"] >= 0.01  # the first batch at least: its samples are read after it is asked for
    assert sum(seconds.values()) == pytest.approx(phases.end - phases.begin)
    # The loop's sleeps and its waits for the loader are off the CPU, and no more than the loop's wall time is.
    off_cpu = phases.loop_off_cpu_seconds()
    assert 3 * 0.02 <= off_cpu <= seconds["loop"] + seconds["loader waits"] + 1e-3
    assert val.LoaderPhases().seconds() is None and val.LoaderPhases().loop_off_cpu_seconds() is None


def test_setup_split_at_the_validators_steps():
    """The set-up's steps end where the validator's methods return, together the set-up; a step not taken counts
    with the next; the garbage collector's time is counted."""
    import gc

    from ultralytics.engine.validator import BaseValidator
    from ultralytics.nn.autobackend import AutoBackend

    phases = val.LoaderPhases()
    with phases.timing():
        time.sleep(0.02)
        BaseValidator.get_model(None, "model")  # (stock's or the patch's: a str is not a model to copy)
        time.sleep(0.03)
        with pytest.raises(AttributeError):
            AutoBackend.warmup(None)  # the warm-up's end noted, though it failed
        gc.collect()
        loader = DatasetBatches(list(range(4)), [[0, 1], [2, 3]], list, threads=1, read_ahead=1)
        assert list(loader) == [[0, 1], [2, 3]]
    split = phases.setup_seconds()
    assert list(split) == list(val.SETUP_STEPS)
    assert split["model copy"] >= 0.02 and split["AutoBackend"] == 0.0 and split["dataset and loader"] == 0.0
    assert split["warm-up"] >= 0.03
    assert sum(split.values()) == pytest.approx(phases.seconds()["set-up"])
    assert phases.gc_seconds > 0
    assert val.LoaderPhases().setup_seconds() is None


def test_cpu_smoke_run_and_records(tmp_path, capsys):
    records = tmp_path / "val.json"
    records.write_text(json.dumps([{"benchmark": "val", "kept": True}]))
    val.main(["--device", "cpu", "--models", "yolo11n.yaml", "--images", "8", "--batch", "4", "--imgsz", "256",
              "--repeats", "1", "--warmup", "0", "--loader-ab", "--without", "area_attention", "--json", str(records)])
    assert "| yolo11n.yaml | fp32 |" in capsys.readouterr().out
    kept, record = json.loads(records.read_text())
    assert kept == {"benchmark": "val", "kept": True}  # appended, not overwritten
    assert record["benchmark"] == "val" and record["table"] == "cpu" and record["gpu"] is None
    assert record["config"] == {"model": "yolo11n.yaml", "images": 8, "batch": 4, "imgsz": 256, "precision": "fp32"}
    figures = record["figures"]
    assert figures["stock_ms_per_image"] > 0 and figures["ours_ms_per_image"] > 0
    assert figures["ours_stock_loader_ms_per_image"] > 0
    assert figures["ours_without_patches"] == ["area_attention"] and figures["ours_without_ms_per_image"] > 0
    assert len(figures["ours_without_stages_ms"]) == len(val.STAGES) + 1
    assert len(figures["stock_stages_ms"]) == len(figures["ours_stages_ms"]) == len(val.STAGES) + 1
    assert figures["same_printed_digits"] and figures["ours_metrics"] == figures["stock_metrics"]
    assert float(figures["stock_metrics"][1]) > 0  # the labels are the model's own boxes: it recalls some
    assert figures["host_other_cores"] >= 0 and 0 <= figures["host_steal_percent"] <= 100

    spec = importlib.util.spec_from_file_location("render_results", REPO / "benchmarks" / "render_results.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    page = render.render([record])
    assert "## Validation: `model.val` (`bench val`)" in page
    assert f"| yolo11n.yaml | fp32 | 8, 4, 256 | {figures['stock_ms_per_image']} |" in page
    assert f"| {figures['ours_without_ms_per_image']} (without area_attention) |" in page


def test_a_models_records_are_written_before_the_next_model_runs(tmp_path, monkeypatch):
    """A run cut short (the device's time limit, an error) keeps the records of the models it finished."""
    records = tmp_path / "val.json"

    def bench_model(name, args, folder):
        if name == "second.yaml":
            raise RuntimeError("cut short")
        return [{"model": name}]

    monkeypatch.setattr(val, "bench_model", bench_model)
    monkeypatch.setattr(val, "records", lambda rows, device: [{"benchmark": "val", "rows": rows}])
    with pytest.raises(RuntimeError, match="cut short"):
        val.main(["--device", "cpu", "--models", "first.yaml", "second.yaml", "--json", str(records)])
    assert json.loads(records.read_text()) == [{"benchmark": "val", "rows": [{"model": "first.yaml"}]}]


def test_the_without_side_reverts_only_the_named_patches_for_its_call():
    """``--without``'s side runs with the named patches reverted and the others applied; after the call every patch
    is applied again; the other sides keep all of them."""
    import yolo_fastdetect
    from yolo_fastdetect.patches import PATCHES

    applicable = {patch.name for patch in PATCHES if patch.reason is None}
    named = ("area_attention", "val_metrics")
    assert set(named) <= applicable
    seen = {}

    class Model:
        def val(self, **options):
            seen[options["name"]] = {patch.name for patch in PATCHES if patch.is_applied()}
            return "metrics"

    for side in ("stock", "ours", val.WITHOUT):
        val.val_once(Model(), Path("data.yaml"), {}, "cpu", side, without=named)
    assert seen["stock"] == set() and seen["ours"] == applicable
    assert seen[val.WITHOUT] == applicable - set(named)
    assert {patch.name for patch in PATCHES if patch.is_applied()} == applicable
    yolo_fastdetect.enable()


def test_the_without_side_applies_its_patches_again_after_an_error():
    from yolo_fastdetect.patches import PATCHES

    class Failing:
        def val(self, **options):
            raise RuntimeError("val failed")

    with pytest.raises(RuntimeError, match="val failed"):
        val.val_once(Failing(), Path("data.yaml"), {}, "cpu", val.WITHOUT, without=("area_attention",))
    assert next(patch for patch in PATCHES if patch.name == "area_attention").is_applied()


def test_without_names_a_patch(capsys):
    with pytest.raises(SystemExit):
        val.main(["--device", "cpu", "--without", "no_such_patch"])
    assert "invalid choice: 'no_such_patch'" in capsys.readouterr().err
