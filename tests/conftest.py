"""Shared test set-up: offline, quiet Ultralytics; a fresh random seed per test; a ``cuda`` marker that skips."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

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


SEED_VARIABLE = "YOLO_FASTDETECT_TEST_SEED"


@pytest.fixture
def generator() -> torch.Generator:
    """A CPU generator seeded freshly from the OS for each test, or from ``YOLO_FASTDETECT_TEST_SEED`` to replay a
    failure (the seed is printed, and pytest shows it for a failing test)."""
    from yolo_fastdetect import config  # here, not above: conftest sets the environment before the package loads

    seed = config.get(SEED_VARIABLE)
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    print(f"random seed: {seed} (replay: {SEED_VARIABLE}={seed})")
    return torch.Generator().manual_seed(seed)


def devices() -> list[str]:
    """Devices every op test runs on: the CPU always, CUDA where present (marked, so it skips elsewhere)."""
    return ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true",
                     help="also run the tests marked slow (the heaviest), as CI does; a machine with a GPU always does")


def pytest_configure(config):
    if not config.getoption("--runslow") and not HAS_CUDA:
        config.option.markexpr = " and ".join(filter(None, [config.option.markexpr, "not slow"]))


def subprocess_env(**overrides: str) -> dict[str, str]:
    """The environment for a child Python: this checkout first on its path, the parent's path kept (the GPU machine
    carries Ultralytics on PYTHONPATH)."""
    repo = str(Path(__file__).resolve().parents[1])
    python_path = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": python_path, **overrides}


def detecting_model(device: str = "cpu", config: str = "yolo11n.yaml", logit_scale: float = 1.0,
                    background: float = -6.0, calibrated: bool = False):
    """The benchmarks' seeded model that detects (:func:`yolo_fastdetect.bench._timing.detecting_model`) on
    ``device``: person and bus biases raised, the others at ``background``, ``logit_scale`` 1e7 for scores without
    ties, ``calibrated`` batch norms for features of a trained model's scale."""
    from yolo_fastdetect.bench._timing import detecting_model as seeded_model

    return seeded_model(config, device, logit_scale, background=background, calibrated=calibrated)


def asset_images() -> list[str]:
    """The images the Ultralytics wheel ships (:func:`yolo_fastdetect.bench._tiny_dataset.asset_images`)."""
    from yolo_fastdetect.bench._tiny_dataset import asset_images as wheel_images

    return wheel_images()


def write_tiny_dataset(root: Path, num_classes: int) -> Path:
    """Four labelled images and their data yaml (:func:`yolo_fastdetect.bench._tiny_dataset.write_tiny_dataset`)."""
    from yolo_fastdetect.bench._tiny_dataset import write_tiny_dataset as write

    return write(root, num_classes)


def sorted_rows(rows: torch.Tensor) -> torch.Tensor:
    """The rows of a 2-D tensor in lexicographic order (on the CPU): tied scores may list their boxes in another order
    on each side, and the same rows in any order are the same detections."""
    rows = rows.detach().cpu()
    order = list(range(len(rows)))
    order.sort(key=lambda index: rows[index].tolist())
    return rows[order]


def assert_same_results_bitwise(ours: list, stock: list) -> None:
    """Per image the same boxes (xyxy, confidence, class), bit for bit, in any order of tied rows; and the same
    masks and keypoints where the task has them."""
    assert len(ours) == len(stock)
    assert sum(len(result.boxes) for result in stock) > 0, "the seeded model should detect something"
    for index, (mine, theirs) in enumerate(zip(ours, stock)):
        counts = f"image {index}: {len(mine.boxes)} boxes, stock {len(theirs.boxes)}"
        assert mine.boxes.data.shape == theirs.boxes.data.shape, counts
        assert mine.boxes.data.dtype == theirs.boxes.data.dtype
        if torch.equal(mine.boxes.data, theirs.boxes.data):
            pairs = [(getattr(mine, name), getattr(theirs, name)) for name in ("masks", "keypoints")]
            for ours_extra, stock_extra in pairs:
                assert (ours_extra is None) == (stock_extra is None)
                if stock_extra is not None:
                    assert torch.equal(ours_extra.data, stock_extra.data), f"image {index}: masks or keypoints"
            continue
        difference = (sorted_rows(mine.boxes.data).double() - sorted_rows(theirs.boxes.data).double()).abs()
        assert difference.max().item() == 0, f"image {index}: rows differ by up to {difference.amax(0).tolist()}"


def write_val_dataset(root: Path, model, count: int, imgsz: int, device: str, seed: int) -> Path:
    """``count`` generated images labelled by ``model``'s stock predictions, and their data yaml
    (:func:`yolo_fastdetect.bench._val_dataset.write_val_dataset`)."""
    from yolo_fastdetect.bench._val_dataset import write_val_dataset as write

    return write(root, model, count, imgsz, device, seed)
