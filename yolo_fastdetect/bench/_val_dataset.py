"""A labelled detection set for ``model.val`` made offline from the wheel's bus.jpg and zidane.jpg: random crops,
mirrors and scales (so sizes and aspect ratios differ from image to image and the rectangular batches of validation
differ from batch to batch), labelled by the model itself (stock Ultralytics' predictions at conf 0.25, the most
confident few per image), so that a seeded YAML model scores metrics far from 0 and 1 on it."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from ._tiny_dataset import random_crop, read_assets

# Labels per image at most: a seeded model keeps hundreds of boxes at conf 0.25, and a few are enough to score.
MAX_LABELS = 12
LABEL_CONF = 0.25
# The long side of a generated image, in pixels: around validation's 640, so that both down- and up-scaling occur.
LONG_SIDE = (400, 1300)


def write_images(folder: Path, count: int, seed: int = 0) -> list[Path]:
    """``count`` JPEGs (quality 90): each a random crop of an asset (45 to 100 % of each side), mirrored at random,
    resized so that its long side is in :data:`LONG_SIDE`. Returns their paths in name order."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    assets = read_assets()
    paths = []
    for index in range(count):
        crop = random_crop(assets[index % len(assets)], rng, 0.45)
        crop_h, crop_w = crop.shape[:2]
        scale = rng.integers(*LONG_SIDE) / max(crop_h, crop_w)
        size = max(1, round(crop_w * scale)), max(1, round(crop_h * scale))
        path = folder / f"val_{index:05d}.jpg"
        cv2.imwrite(str(path), cv2.resize(np.ascontiguousarray(crop), size, interpolation=cv2.INTER_AREA),
                    [cv2.IMWRITE_JPEG_QUALITY, 90])
        paths.append(path)
    return paths


def write_val_dataset(root: Path, model, count: int, imgsz: int = 640, device: str | None = None,
                      seed: int = 0) -> Path:
    """``count`` images (:func:`write_images`) under ``root/images``, their YOLO labels under ``root/labels``: the
    :data:`MAX_LABELS` most confident of stock ``model.predict``'s boxes at conf :data:`LABEL_CONF` (the package
    off), and the data yaml naming the model's classes.

    Returns:
        The data yaml's path.

    Examples:
        >>> from yolo_fastdetect.bench._timing import detecting_model
        >>> data = write_val_dataset(Path("/tmp/val_set"), detecting_model("yolo11n.yaml", calibrated=True), 64)
    """
    import yolo_fastdetect

    write_images(root / "images", count, seed)
    labels = root / "labels"
    labels.mkdir(parents=True, exist_ok=True)
    with yolo_fastdetect.disabled():
        results = model.predict(str(root / "images"), imgsz=imgsz, conf=LABEL_CONF, max_det=MAX_LABELS,
                                device=device, stream=True, verbose=False)
        for result in results:
            rows = [f"{int(c)} {x:.6f} {y:.6f} {w:.6f} {h:.6f}"
                    for c, (x, y, w, h) in zip(result.boxes.cls.tolist(), result.boxes.xywhn.tolist())]
            (labels / f"{Path(result.path).stem}.txt").write_text("".join(f"{row}\n" for row in rows))
    names = "".join(f"  {index}: {name}\n" for index, name in model.names.items())
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images\nval: images\nnames:\n{names}")
    return data
