"""Shared test set-up: offline, quiet Ultralytics; a fresh random seed per test; a ``cuda`` marker that skips."""

from __future__ import annotations

import os
import tempfile

# Before anything imports ultralytics: no network, no installs, no settings written to the home directory.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "false")
os.environ.setdefault("ULTRALYTICS_SKIP_REQUIREMENTS_CHECKS", "1")
os.environ.setdefault("YOLO_VERBOSE", "false")
os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="yfd_yolo_config_"))

import pytest  # noqa: E402
import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)


@pytest.fixture
def generator() -> torch.Generator:
    """A CPU generator seeded freshly from the OS for each test (the seed is printed on failure)."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed: {seed}")
    return torch.Generator().manual_seed(seed)


def devices() -> list[str]:
    """Devices every op test runs on: the CPU always, CUDA where present (marked, so it skips elsewhere)."""
    return ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow (larger model sizes)")


def pytest_configure(config):
    if not config.getoption("--runslow") and not HAS_CUDA:
        config.option.markexpr = " and ".join(filter(None, [config.option.markexpr, "not slow"]))
