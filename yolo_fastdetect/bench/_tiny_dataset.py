"""The tiny labelled set that validation checks run on, written offline from the wheel's bus.jpg and zidane.jpg."""

from __future__ import annotations

import shutil
from pathlib import Path

# YOLO labels (class, centre x, centre y, width, height; normalised) of the persons, the bus and the tie.
LABELS = {
    "bus": ["0 0.23 0.61 0.19 0.54", "0 0.34 0.61 0.14 0.50", "5 0.50 0.44 0.96 0.60", "0 0.85 0.61 0.20 0.53"],
    "zidane": ["0 0.68 0.56 0.40 0.88", "0 0.26 0.66 0.34 0.68", "27 0.54 0.82 0.05 0.32"],
}


def asset_images() -> list[str]:
    """The images the Ultralytics wheel ships (bus, then zidane)."""
    from ultralytics.utils import ASSETS

    return [str(ASSETS / "bus.jpg"), str(ASSETS / "zidane.jpg")]


def read_assets() -> list:
    """The wheel's images as BGR arrays (bus, then zidane)."""
    import cv2

    return [cv2.imread(path) for path in asset_images()]


def random_crop(image, rng, least: float):
    """A random crop of ``image`` (``least`` to all of each side, drawn by the numpy generator ``rng``), mirrored
    half the time: a view, not a copy."""
    height, width = image.shape[:2]
    crop_h, crop_w = int(height * rng.uniform(least, 1.0)), int(width * rng.uniform(least, 1.0))
    top, left = rng.integers(0, height - crop_h + 1), rng.integers(0, width - crop_w + 1)
    crop = image[top : top + crop_h, left : left + crop_w]
    return crop[:, ::-1] if rng.random() < 0.5 else crop


def write_tiny_dataset(root: Path, num_classes: int) -> Path:
    """Four images (bus and zidane, twice each) with YOLO labels under ``root``, and the data yaml naming them.

    Returns:
        The data yaml's path.
    """
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    for copy in range(2):
        for asset in asset_images():
            name = f"{Path(asset).stem}_{copy}"
            shutil.copy(asset, root / "images" / f"{name}.jpg")
            (root / "labels" / f"{name}.txt").write_text("\n".join(LABELS[Path(asset).stem]) + "\n")
    names = "\n".join(f"  {i}: class{i}" for i in range(num_classes))
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images\nval: images\nnames:\n{names}\n")
    return data
