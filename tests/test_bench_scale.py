"""``bench scale``'s steady rate: the rows of an output folder's files after the first, over the time between the
first file's write and the last's."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow comes with the ray extra")
pq = pytest.importorskip("pyarrow.parquet")

from yolo_fastdetect.bench.scale import steady_rate  # noqa: E402


def write_batches(folder, rows_and_times) -> None:
    """One Parquet file per (rows, modification time), named so that their names' order is not their times'."""
    for index, (rows, mtime) in enumerate(rows_and_times):
        file = folder / f"{len(rows_and_times) - index:03d}_{rows}.parquet"
        pq.write_table(pa.table({"path": [f"img_{index}_{row}.jpg" for row in range(rows)]}), file)
        os.utime(file, (mtime, mtime))


def test_steady_rate_leaves_out_the_first_file(tmp_path):
    rng = np.random.default_rng(20261201)
    rows = rng.integers(1, 65, size=7).tolist()
    times = (1_000_000 + np.cumsum(rng.uniform(0.05, 2.0, size=7))).tolist()  # the first file after a slow start
    write_batches(tmp_path, list(zip(rows, times)))
    assert steady_rate(tmp_path) == pytest.approx(sum(rows[1:]) / (times[-1] - times[0]), rel=1e-6)


def test_steady_rate_of_one_file_is_nan(tmp_path):
    write_batches(tmp_path, [(64, 1_000_000.0)])
    assert math.isnan(steady_rate(tmp_path))
