"""The version matrix: every tested Ultralytics release, stock against patched, one interpreter per release.

The releases are folders that each hold one ``ultralytics`` install (``.ci/run`` installs them ``--no-deps``), listed in
``YOLO_FASTDETECT_ULTRALYTICS_SITES`` (separated as ``PYTHONPATH`` is); without it these tests skip. Each runs
:mod:`yolo_fastdetect.bench._version_check` with that folder first on ``PYTHONPATH`` (the pre-release guard,
:mod:`yolo_fastdetect.bench.versions`, runs the same child) and asserts every check of its JSON report passed: import,
enable/disable, ``predict`` and ``val`` against stock on seeded YAML models, file sources. The CPU children run side by
side, one per core (:func:`cpu_reports`).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from yolo_fastdetect import config
from yolo_fastdetect.bench.versions import check_release, render

SITES_VARIABLE = "YOLO_FASTDETECT_ULTRALYTICS_SITES"
# The patches whose structure every tested release has (8.3.0 on): one of them off there is a failed check, not a
# decline. The others decline on older releases (their reports say why).
ALWAYS_ON = ("detect_head", "nms", "predictor")


def release_folders() -> list:
    """One parameter per folder of ``YOLO_FASTDETECT_ULTRALYTICS_SITES``, or one that skips where it is unset."""
    folders = listed_folders()
    if not folders:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{SITES_VARIABLE} lists no Ultralytics releases"))]
    return [pytest.param(folder, id=folder.name) for folder in folders]


def listed_folders() -> list[Path]:
    return [Path(folder) for folder in config.get(SITES_VARIABLE).split(os.pathsep) if folder]


@pytest.fixture(scope="module")
def cpu_reports() -> dict[Path, Future]:
    """Each release's CPU report, as a future. The children start when the first test asks, side by side, one per
    core of this process at a time: each runs mostly on one core, so the matrix takes about half its serial time on
    CI's two cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=cores) as pool:
        yield {folder: pool.submit(check_release, folder, device="cpu") for folder in listed_folders()}


def assert_release_passes(report: dict) -> None:
    print(render(report))  # the per-check durations and states, shown with -s or on failure
    assert report["ok"], render(report)
    assert all(report["patches"][name] == "on" for name in ALWAYS_ON), render(report)
    for name, state in report["patches"].items():  # the start-up line names each patch off and its reason
        assert state == "on" or f"{name} {state}" in report["state_line"], report["state_line"]
    assert any(row["name"].startswith("val ") for row in report["checks"]), render(report)


@pytest.mark.parametrize("folder", release_folders())
def test_release_matches_stock(folder, cpu_reports):
    assert_release_passes(cpu_reports[folder].result())


@pytest.mark.cuda
@pytest.mark.parametrize("folder", release_folders())
def test_release_matches_stock_on_the_gpu(folder):
    """The same checks with ``device=0``: the GPU letterbox, CUDA graphs and the graphed post-processing run."""
    assert_release_passes(check_release(folder, device="0"))


def test_guard_help_exits_0(capsys):
    from yolo_fastdetect.bench.versions import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "usage: python -m yolo_fastdetect.bench.versions" in capsys.readouterr().out
