"""``predict_dataset`` (``predict-many``) on videos: each video one task, one row per frame with its index, equal to
``model.predict`` on that video alone; a video that does not open is an error row; resume skips whole videos."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (the [ray] extra)")
import pyarrow.parquet as pq  # noqa: E402 - Ray's dependency, only there with it

from test_ray import CLUSTER, IMGSZ, canonical, cluster, model  # noqa: E402, F401 - fixtures shared with test_ray
from video_corpus import panning_frames, write_opencv  # noqa: E402
from yolo_fastdetect.ray import predict_dataset  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Two clips of unequal sizes and lengths, a file named .mp4 that is no video, and one image."""
    root = tmp_path_factory.mktemp("ray_videos")
    write_opencv(root / "a.mp4", 12, 160, 120)
    write_opencv(root / "b.mp4", 7, 171, 97, start=2)
    (root / "c_not_video.mp4").write_text("not a video\n" * 50)
    cv2.imwrite(str(root / "d.jpg"), panning_frames(1, 160, 120)[0])
    return root


def stock_frames(model, video: Path) -> list[tuple]:
    """``model.predict`` on the video alone: per frame (size, xyxy, conf, classes)."""
    model.predictor = None
    return [((r.orig_shape[1], r.orig_shape[0]), r.boxes.xyxy.numpy(), r.boxes.conf.numpy(),
             r.boxes.cls.numpy().astype(np.int32))
            for r in model.predict(str(video), stream=True, batch=4, imgsz=IMGSZ, verbose=False)]


@CLUSTER
def test_videos_give_a_row_per_frame_and_resume_per_video(cluster, model, folder, tmp_path):
    a, b, broken, image = (str(folder / name) for name in ("a.mp4", "b.mp4", "c_not_video.mp4", "d.jpg"))
    first = predict_dataset(model, [a], tmp_path, batch_size=4, imgsz=IMGSZ)
    assert (first.images, first.failures, first.already_written) == (12, 0, 0)

    second = predict_dataset(model, str(folder), tmp_path, batch_size=4, imgsz=IMGSZ)
    assert (second.images, second.failures, second.already_written) == (7 + 1 + 1, 1, 12)  # b, the image, broken
    rows = pq.read_table(tmp_path).to_pylist()
    by_video = {path: sorted((r for r in rows if r["path"] == path), key=lambda r: r["frame"]) for path in (a, b)}
    for path in (a, b):
        stock = stock_frames(model, Path(path))
        assert [r["frame"] for r in by_video[path]] == list(range(1, len(stock) + 1)), path
        for row, (size, *boxes) in zip(by_video[path], stock):
            assert row["error"] is None and (row["width"], row["height"]) == size
            ours, theirs = canonical(row["xyxy"], row["conf"], row["class_id"]), canonical(*boxes)
            assert ours.shape == theirs.shape and (ours[:, 1] == theirs[:, 1]).all(), (path, row["frame"])
            np.testing.assert_allclose(ours[:, 2:], theirs[:, 2:], atol=1e-3)
    assert sum(len(r["conf"]) for r in rows) > 10 * len(rows), "the model should detect something"
    (broken_row,) = [r for r in rows if r["path"] == broken]
    assert broken_row["frame"] is None and broken_row["error"].startswith("video read error: FileNotFoundError")
    assert broken in broken_row["error"]
    (image_row,) = [r for r in rows if r["path"] == image]
    assert image_row["frame"] is None and image_row["error"] is None

    third = predict_dataset(model, str(folder), tmp_path, batch_size=4, imgsz=IMGSZ)
    assert (third.images, third.already_written) == (0, len(rows))
