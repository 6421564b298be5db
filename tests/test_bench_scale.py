"""``bench scale``'s steady rate: the rows of every batch the actors noted after the first, over the time from the
first note to the last."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow", reason="pyarrow comes with the ray extra")

from yolo_fastdetect.bench._scale_actor import TIMES_VARIABLE, TimedPredictor, steady_rate  # noqa: E402
from yolo_fastdetect.ray import Predictor  # noqa: E402


def note(folder: Path, seconds: float, rows: int, thread: int = 1) -> None:
    """A note as :class:`TimedPredictor` writes it."""
    (folder / f"{seconds:.6f}_{rows}_{1234}_{thread}").touch()


def test_steady_rate_leaves_out_the_first_batch(tmp_path):
    rng = np.random.default_rng(20261201)
    rows = rng.integers(1, 65, size=7).tolist()
    times = (1_000_000 + np.cumsum(rng.uniform(0.05, 2.0, size=7))).tolist()  # the first batch after a slow start
    for index in rng.permutation(7):  # two threads of one actor, notes in no order
        note(tmp_path, times[index], rows[index], thread=int(index % 2))
    assert steady_rate(tmp_path) == pytest.approx(sum(rows[1:]) / (times[-1] - times[0]), rel=1e-6)


def test_steady_rate_of_one_batch_is_nan(tmp_path):
    note(tmp_path, 1_000_000.0, 64)
    assert math.isnan(steady_rate(tmp_path))


def test_timed_predictor_notes_each_batch(tmp_path, monkeypatch):
    """The actor's class, in this process on the CPU, with the seeded model that detects: its rows are Predictor's,
    and each call leaves one note of its rows."""
    import pyarrow.compute as pc

    from conftest import asset_images, detecting_model

    monkeypatch.setenv(TIMES_VARIABLE, str(tmp_path))
    model = detecting_model("cpu", logit_scale=1e7)
    batch = {"path": np.array([*asset_images(), str(tmp_path.parent / "missing.jpg")])}
    timed, plain = TimedPredictor(model, device="cpu", imgsz=160), Predictor(model, device="cpu", imgsz=160)
    ours = timed(batch)
    assert ours.equals(plain(batch)) and pc.sum(pc.list_value_length(ours["conf"])).as_py() > 0
    timed(batch)
    assert sorted(int(note.name.split("_")[1]) for note in tmp_path.iterdir()) == [3, 3]
