"""``yolo_fastdetect.ray`` on a local Ray cluster (``ray.init(num_cpus=2)``, CPU actors): its detections against
single-process ``model.predict`` on the same files (same paths, boxes, scores, classes), decoded in Ray tasks and in
the actors, unreadable files as error rows, resume, an actor killed mid-run (no image lost or written twice), a
grayscale model, the ``predict-many`` command.

The images are made from the wheel's two assets in three sizes (so that batches mix sizes), with a corrupt and an
empty file. ``model.predict`` here runs in this process with the patch on, as the actors do; the actors predict
whole batches, the reference one file at a time, so boxes are compared within 1e-3 px and scores within 1e-5
(batched CPU convolutions may round differently), the rest exactly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (the [ray] extra)")
import pyarrow.parquet as pq  # noqa: E402 - Ray's dependency, only there with it
from ray.data.block import BlockAccessor  # noqa: E402

from conftest import detecting_model, subprocess_env  # noqa: E402
from yolo_fastdetect.bench._source_data import write_jpegs  # noqa: E402
from yolo_fastdetect.ray import (  # noqa: E402
    Predictor,
    decode_batch,
    decode_mode,
    decode_rows,
    input_channels,
    predict_dataset,
    written,
)

IMGSZ = 160  # small inputs keep 2 CPU cores fast enough; nothing here depends on the size
# The tests on a local cluster are among the heaviest (10-30 s each on 2 cores, Ray's start-up once per module): the
# slow set, which CI runs beside the others.
CLUSTER = pytest.mark.slow
SIZES = ((320, 240), (256, 192), (240, 320))
BROKEN = ("y_corrupt.jpg", "z_empty.jpg")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """30 JPEGs of three sizes, then a corrupt and an empty file (a folder lists them last, by name)."""
    root = tmp_path_factory.mktemp("ray_images")
    write_jpegs(root, 30, sizes=SIZES, qualities=(90,), seed=1)
    (root / BROKEN[0]).write_bytes(b"\xff\xd8 not a JPEG " + bytes(range(256)))
    (root / BROKEN[1]).write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def model():
    return detecting_model("cpu", logit_scale=1e7)  # scores without ties: the same boxes in the same order


@pytest.fixture(scope="module")
def expected(model, folder) -> dict[str, tuple]:
    """Single-process ``model.predict`` on the folder, one file at a time: path -> (size, xyxy, conf, class ids)."""
    model.predictor = None
    return {r.path: ((r.orig_shape[1], r.orig_shape[0]), r.boxes.xyxy.numpy(), r.boxes.conf.numpy(),
                     r.boxes.cls.numpy().astype(np.int32))
            for r in model.predict(str(folder), stream=True, batch=1, imgsz=IMGSZ, verbose=False)}


@pytest.fixture(scope="module")
def cluster():
    """A local cluster of 2 CPUs and no GPU, started once for the module; workers import this checkout and the tests.
    (Ray would otherwise count a machine's GPUs, and predict_dataset would put its actors there: on the H200 the
    grayscale test's CPU reference then differed from the GPU actor's boxes, 32af191.)"""
    tests = Path(__file__).parent
    os.environ["PYTHONPATH"] = subprocess_env(PYTHONPATH=os.pathsep.join(
        filter(None, [str(tests.parent), str(tests), os.environ.get("PYTHONPATH")])))["PYTHONPATH"]
    context = ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield context
    ray.shutdown()


def output_rows(output: Path) -> dict[str, dict]:
    """Every row of a Parquet output folder, by path (asserting that no path is there twice)."""
    rows = pq.read_table(output).to_pylist()
    paths = [row["path"] for row in rows]
    assert len(paths) == len(set(paths)), "a path was written twice"
    return {row["path"]: row for row in rows}


def canonical(xyxy, conf, classes) -> np.ndarray:
    """Boxes as (n, 6) [conf, class, x1, y1, x2, y2] rows in one order: NMS keeps boxes of equal score in either
    order (the scores saturate at the same float for some boxes)."""
    table = np.column_stack([np.asarray(conf, np.float64), classes, np.asarray(xyxy, np.float64).reshape(-1, 4)])
    return table[np.lexsort([*np.round(table[:, :0:-1].T, 1), np.round(-table[:, 0], 4)])]


def assert_detections(rows: dict[str, dict], expected: dict[str, tuple]) -> None:
    """Each expected path's row holds stock's detections."""
    for path, (size, *boxes) in expected.items():
        row = rows[path]
        assert row["error"] is None and (row["width"], row["height"]) == size, path
        ours, stock = canonical(row["xyxy"], row["conf"], row["class_id"]), canonical(*boxes)
        assert ours.shape == stock.shape and (ours[:, 1] == stock[:, 1]).all(), path
        np.testing.assert_allclose(ours[:, 2:], stock[:, 2:], atol=1e-3, err_msg=path)
        np.testing.assert_allclose(ours[:, 0], stock[:, 0], atol=1e-5, err_msg=path)
    assert sum(len(e[2]) for e in expected.values()) > 10 * len(expected), "the model should detect something"


def assert_rows_match(rows: dict[str, dict], expected: dict[str, tuple], folder: Path) -> None:
    """Rows for exactly the folder's files: stock's detections for the images, an error for the broken files."""
    assert sorted(rows) == sorted([*expected, *(str(folder / name) for name in BROKEN)])
    assert_detections(rows, expected)
    for name in BROKEN:
        row = rows[str(folder / name)]
        assert row["error"] == f"image read error: {folder / name}" and row["conf"] == [] and row["width"] is None


def as_ray_batch(table) -> dict[str, np.ndarray]:
    """A block as the next stage's ``batch_format="numpy"`` batch (Ray's own conversion)."""
    return BlockAccessor.for_block(table).to_batch_format("numpy")


def test_predictor_rows_match_predict(model, folder, expected):
    """The map_batches class on its own, in this process: a mixed batch of paths, of bytes, and a missing file; and
    the same batch decoded ahead (``decode_batch``, then Ray's Arrow round trip), which it predicts as it is (its
    paths renamed to files that do not exist: nothing is read again)."""
    paths = sorted(str(p) for p in folder.iterdir()) + [str(folder / "missing.jpg")]
    predictor = Predictor(model, imgsz=IMGSZ, decode_threads=2)
    by_path = predictor({"path": np.array(paths, dtype=object)})
    contents = np.array([Path(p).read_bytes() for p in paths[:-1]] + [b""], dtype=object)
    by_bytes = predictor({"path": np.array(paths, dtype=object), "bytes": contents})
    decoded = as_ray_batch(decode_batch({"path": np.array(paths, dtype=object)}))
    by_decoded = predictor({**decoded, "path": np.array([f"{path}.gone" for path in paths], dtype=object)})

    rows = {row["path"]: row for row in by_path.to_pylist()}
    assert rows.pop(paths[-1])["error"] == f"file not found: {paths[-1]}"
    assert_rows_match(rows, expected, folder)
    assert by_bytes.drop_columns("error").equals(by_path.drop_columns("error"))
    assert by_bytes["error"].to_pylist()[:-1] == by_path["error"].to_pylist()[:-1]
    assert by_decoded.drop_columns("path").equals(by_path.drop_columns("path"))


@pytest.mark.parametrize("lower_priority", [False, True])
@pytest.mark.parametrize("channels", [3, 1])
def test_decode_batch_is_decode_rows(folder, channels, lower_priority):
    """The decode stage's rows, after Ray's Arrow round trip: the images of ``decode_rows`` (gray for a grayscale
    model), an empty image and the message for each row that failed (corrupt, empty, missing, bytes of nothing),
    no ``bytes`` column; images of one size come as one array, of several sizes as one per row. The same below the
    task's priority (as ahead of GPU actors)."""
    paths = sorted(str(p) for p in folder.iterdir()) + [str(folder / "missing.jpg")]
    contents = [None if index % 2 else Path(path).read_bytes() for index, path in enumerate(paths[:-1])] + [b""]
    reference = decode_rows(paths, contents, channels)
    batch = {"path": np.array(paths, dtype=object), "bytes": np.array(contents, dtype=object)}
    decoded = as_ray_batch(decode_batch(batch, channels, lower_priority))
    assert sorted(decoded) == ["error", "image", "path"] and list(decoded["path"]) == paths
    assert decoded["image"].dtype == object  # several sizes
    errors = [image if isinstance(image, str) else None for image in reference]
    assert list(decoded["error"]) == errors and errors[-3:] == [f"image read error: {paths[-3]}",
                                                                f"image read error: {paths[-2]}",
                                                                f"image read error: {paths[-1]}"]
    for image, expected_image in zip(decoded["image"], reference):
        expected_image = np.zeros((0, 0, channels), np.uint8) if isinstance(expected_image, str) else expected_image
        assert image.dtype == np.uint8 and image.shape[2] == channels
        np.testing.assert_array_equal(image, expected_image)

    one_size = as_ray_batch(decode_batch({"path": np.array(paths[:4:3], dtype=object)}, channels))["image"]
    assert one_size.shape == (2, *reference[0].shape)  # the 1st and 4th files: one size of the three
    np.testing.assert_array_equal(one_size[1], reference[3])


@CLUSTER
def test_predict_dataset_matches_predict_and_resumes(cluster, model, folder, expected, tmp_path):
    """A list of 12 paths decoded in the actor, then every file as a Dataset of bytes decoded in Ray tasks, then the
    folder, into one output: each run predicts only what is not there yet (resume; a file cut short by a crash is
    dropped), and the output holds each file once, with stock's detections and the broken files' errors."""
    paths = sorted(str(p) for p in folder.iterdir())
    first = predict_dataset(model, paths[:12], tmp_path, batch_size=4, imgsz=IMGSZ, decode="actor", decode_threads=2)
    assert (first.images, first.failures, first.already_written) == (12, 0, 0)
    assert first.detections == sum(len(expected[p][2]) for p in paths[:12])

    (tmp_path / "cut_short.parquet").write_bytes(b"PAR1 and no footer")
    files = ray.data.read_binary_files(paths, include_paths=True)
    second = predict_dataset(model, files, tmp_path, batch_size=4, imgsz=IMGSZ, decode="tasks")
    assert not (tmp_path / "cut_short.parquet").exists()
    assert (second.images, second.failures, second.already_written) == (len(paths) - 12, 2, 12)
    assert first.detections + second.detections == sum(len(e[2]) for e in expected.values())
    assert_rows_match(output_rows(tmp_path), expected, folder)

    third = predict_dataset(model, str(folder), tmp_path, batch_size=4, imgsz=IMGSZ)
    assert (third.images, third.already_written) == (0, len(paths))


@pytest.mark.parametrize("config", ["yolo11n-pose.yaml", "yolo11n-seg.yaml"])
def test_predictor_keypoints_and_polygons(config, folder):
    """Pose and Segment models: each box's keypoints (``Results.keypoints.data``) and outline (``masks.xy``). The
    three images have three sizes, so each is predicted alone, as ``model.predict(path)`` predicts it: same order."""
    model = detecting_model("cpu", config=config, logit_scale=1e7)
    paths = sorted(str(p) for p in folder.glob("img_0000[0-2]_*.jpg"))
    rows = Predictor(model, imgsz=IMGSZ, decode_threads=2)({"path": np.array(paths, dtype=object)}).to_pylist()
    for path, row in zip(paths, rows):
        result = model.predict(path, imgsz=IMGSZ, verbose=False)[0]
        assert len(row["conf"]) == len(result.boxes) > 0, path
        if config.endswith("pose.yaml"):
            np.testing.assert_allclose(np.array(row["keypoints"]), result.keypoints.data.numpy(), atol=1e-3)
        else:
            assert len(row["polygons"]) == len(result.masks.xy)
            for ours, stock in zip(row["polygons"], result.masks.xy):
                np.testing.assert_allclose(np.array(ours).reshape(-1, 2), stock, atol=1e-3)


def _actor_titles(session_dir: str) -> dict[int, bytes]:
    """Process titles of this cluster's live Predictor actors, by process id: Ray titles an actor's process after its
    operator (``MapBatches(Predictor)``, with any stage fused into it), and names each worker's log after its process
    id (other clusters on this machine keep theirs)."""
    titles = {}
    for log in Path(session_dir, "logs").glob("python-core-worker-*.log"):
        pid = log.stem.rpartition("_")[2]
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue  # that worker has ended
        if b"MapBatches(Predictor)" in title:
            titles[int(pid)] = title
    return titles


@CLUSTER
@pytest.mark.parametrize("decode", ["actor", "tasks"])
def test_killed_actor_loses_and_duplicates_nothing(cluster, model, folder, expected, tmp_path, decode):
    """SIGKILL the actor while it predicts its first batch (Ray titles its process ``...Predictor)).submit`` then):
    Ray starts another and retries the batches it held; every file is in the output exactly once, with the same
    detections. With the files decoded in Ray tasks, the actors' titles show that Ray Data did not fuse the decode
    stage into theirs.

    (Killing it once a first file was written missed with decode="tasks" on 2 CPUs: the actor had predicted every
    batch, and been let go, before the write tasks got a CPU.)"""
    outcome = {}

    def predict() -> None:
        try:  # batch 1: many batches, so that the kill lands mid-run
            outcome["summary"] = predict_dataset(model, str(folder), tmp_path, batch_size=1, imgsz=IMGSZ,
                                                 decode=decode)
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = error

    run = threading.Thread(target=predict)
    run.start()
    killed, written_at_kill, later_actors, titles = None, 0, set(), set()
    while run.is_alive():
        actors = _actor_titles(cluster.address_info["session_dir"])
        pids, titles = list(actors), titles | set(actors.values())
        predicting = [pid for pid, title in actors.items() if title.endswith(b".submit")]
        if killed is None and predicting:
            killed, written_at_kill = predicting[0], len(list(tmp_path.glob("*.parquet")))
            os.kill(killed, signal.SIGKILL)
        elif killed is not None:
            later_actors.update(set(pids) - {killed})
        time.sleep(0.02)
    run.join()
    assert killed is not None, "the run ended before the actor could be killed"
    assert written_at_kill < len(expected) + len(BROKEN), "the kill came after the last batch"
    assert later_actors, "no actor took over after the kill"
    assert not [title for title in titles if b"decode_batch" in title], f"fused: the actors decoded ({titles})"
    assert "summary" in outcome, f"the run failed: {outcome.get('error')!r}"
    assert outcome["summary"].images == len(expected) + len(BROKEN)
    assert_rows_match(output_rows(tmp_path), expected, folder)


@CLUSTER
def test_grayscale_model_decodes_gray(cluster, folder, tmp_path):
    """A model of one input channel (the seeded model, its first convolution summed over RGB): ``predict_dataset``
    reads its channels on the driver and the decode tasks decode gray, as ``model.predict`` does for it; a missing
    file is an error row."""
    import torch

    model = detecting_model("cpu", logit_scale=1e7)
    first = model.model.model[0].conv
    gray = torch.nn.Conv2d(1, first.out_channels, first.kernel_size, first.stride, first.padding, bias=False)
    gray.weight.data = first.weight.data.sum(1, keepdim=True)
    model.model.model[0].conv, model.model.yaml["channels"] = gray, 1
    assert input_channels(model) == 1
    paths = sorted(str(p) for p in folder.glob("img_0000[0-5]_*.jpg"))
    expected = {r.path: ((r.orig_shape[1], r.orig_shape[0]), r.boxes.xyxy.numpy(), r.boxes.conf.numpy(),
                         r.boxes.cls.numpy().astype(np.int32))
                for r in (model.predict(path, imgsz=IMGSZ, verbose=False)[0] for path in paths)}
    assert model.predictor.dataset.cv2_flag == cv2.IMREAD_GRAYSCALE  # the reference itself read them gray

    missing = str(folder / "missing.jpg")
    summary = predict_dataset(model, [*paths, missing], tmp_path, batch_size=4, imgsz=IMGSZ, decode="tasks")
    assert (summary.images, summary.failures) == (len(paths) + 1, 1)
    rows = output_rows(tmp_path)
    assert rows[missing]["error"] == f"file not found: {missing}" and rows[missing]["conf"] == []
    assert_detections(rows, expected)


@CLUSTER
def test_predict_many_command(cluster, model, folder, tmp_path):
    """The console command, connected to this cluster through RAY_ADDRESS, with a saved model and JSON lines out,
    decoding in the actor (``decode=actor``); its rows match ``model.predict`` of the same saved model."""
    from ultralytics import YOLO

    weights = tmp_path / "model.pt"
    model.save(weights)  # Ultralytics saves the weights in fp16: the reference loads the same file
    output = tmp_path / "out"
    images = sorted(folder.glob("img_0000*.jpg"))
    list_file = tmp_path / "images.txt"
    list_file.write_text("\n".join(map(str, images)) + "\n")
    command = [sys.executable, "-m", "yolo_fastdetect", "predict-many", f"model={weights}", f"source={list_file}",
               f"output={output}", "format=json", "batch=4", f"imgsz={IMGSZ}", "decode=actor"]
    environment = subprocess_env(RAY_ADDRESS=cluster.address_info["address"])
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"predict-many: {len(images)} images (0 failed)" in result.stdout

    reference = {r.path: r for r in YOLO(weights).predict([str(p) for p in images], imgsz=IMGSZ, verbose=False)}
    rows = written(output, "json")
    assert sorted(rows["path"].to_pylist()) == sorted(reference)
    assert dict(zip(rows["path"].to_pylist(), rows["detections"].to_pylist())) == {
        path: len(r.boxes) for path, r in reference.items()}


def test_decode_mode_leaves_the_tasks_a_cpu():
    """The default decodes in tasks only where a CPU is left beyond the actors' (each holds one): on a 1-CPU cluster
    with one actor, the decode tasks never ran and predict_dataset hung (checked by hand at 3b872ad, where tasks was
    the default whatever the CPUs); decode_threads asks for the actor's threads."""
    assert decode_mode(None, None, cluster_cpus=2, actors=1) == "tasks"
    assert decode_mode(None, None, cluster_cpus=1, actors=1) == "actor"
    assert decode_mode(None, None, cluster_cpus=5.5, actors=4) == "tasks"
    assert decode_mode(None, None, cluster_cpus=4.5, actors=4) == "actor"  # a decode task asks for a whole CPU
    assert decode_mode(None, 4, cluster_cpus=16, actors=1) == "actor"
    assert decode_mode("actor", None, cluster_cpus=1, actors=1) == "actor"
    assert decode_mode("tasks", None, cluster_cpus=3, actors=2) == "tasks"
    with pytest.raises(ValueError, match=r"decode='tasks' needs a CPU beyond the actors' .* 2 CPUs for 2 actor"):
        decode_mode("tasks", None, cluster_cpus=2, actors=2)


@CLUSTER
def test_decode_in_tasks_without_a_spare_cpu_is_refused(cluster, model, folder, tmp_path):
    """On the tests' 2-CPU cluster, two CPU actors leave no CPU for decode tasks: refused before any work."""
    with pytest.raises(ValueError, match="decode='tasks' needs a CPU beyond the actors'"):
        predict_dataset(model, str(folder), tmp_path, batch_size=4, imgsz=IMGSZ, cpu_actors=2, decode="tasks")
    assert not list(tmp_path.iterdir())


def test_bad_arguments_are_named(model, folder, tmp_path):
    """Each is refused before a cluster starts (none is needed here), with the argument's name."""
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        predict_dataset(model, str(folder), tmp_path, batch_size=0)
    with pytest.raises(ValueError, match="output_format must be one of parquet, json"):
        predict_dataset(model, str(folder), tmp_path, output_format="csv")
    with pytest.raises(ValueError, match="decode must be one of tasks, actor, got 'gpu'"):
        predict_dataset(model, str(folder), tmp_path, decode="gpu")
    with pytest.raises(ValueError, match="decode_threads is for decode='actor'"):
        predict_dataset(model, str(folder), tmp_path, decode="tasks", decode_threads=4)
    with pytest.raises(SyntaxError, match="'imgsize' is not a valid YOLO argument"):
        predict_dataset(model, str(folder), tmp_path, imgsize=IMGSZ)
    with pytest.raises(TypeError, match="source must be a folder"):
        predict_dataset(model, 3, tmp_path)
    with pytest.raises(FileNotFoundError):
        predict_dataset(model, str(folder / "nothing_here"), tmp_path)
    with pytest.raises(ValueError, match="model task 'obb' is not supported"):
        Predictor("yolo11n-obb.yaml")
    help_run = subprocess.run([sys.executable, "-m", "yolo_fastdetect", "predict-many", "--help"], capture_output=True,
                              text=True, env=subprocess_env())
    assert help_run.returncode == 0 and "usage: yolo-fastdetect predict-many" in help_run.stdout
    assert "decode=tasks      where the files decode: tasks (Ray tasks of one CPU each" in help_run.stdout
