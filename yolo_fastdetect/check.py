"""``yolo-fastdetect check``: a user's proof, in one offline command, that the fast path runs on this machine.

It loads (or builds) the operators, predicts with stock Ultralytics and with the patch on the same images (the two
the Ultralytics wheel ships, or ``source=``), and prints which kernels ran on the device, whether the detections
equal stock's, and the speed of ``model.predict`` at batch 1 and 16, stock against ours. It exits with 1, saying
why, when the fast path is not active on the requested device or the detections differ.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time

USAGE = """\
usage: yolo-fastdetect check [model=yolo11n.yaml] [device=0] [source=...] [imgsz=640]
  model    a model file or YAML (a YAML model is seeded, with its person and bus biases raised so that it detects)
  device   0, cuda:1, cpu, ... (default: 0 where a GPU is visible, else cpu)
  source   any Ultralytics source (default: bus.jpg and zidane.jpg from the Ultralytics wheel); up to 16 images
  imgsz    inference size (default 640)
Exit status 0 when the fast path ran on the device and the detections equal stock's, 1 otherwise."""

KEYS = ("model", "device", "source", "imgsz")
MAX_IMAGES = 16
# Operators whose dispatch marks a kernel as having run (their CPU-side record in torch.profiler).
KERNEL_OPERATORS = {
    "decode": "yolo_fastdetect::detect_decode",
    "NMS": "yolo_fastdetect::batched_nms",
    "letterbox": "yolo_fastdetect::letterbox",
}
REQUIRED_KERNELS = ("decode", "NMS")  # the fast path; letterbox and graphs are the GPU predictor's extras


def parse_arguments(argv: list[str]) -> dict[str, str]:
    """``key=value`` arguments (``KEYS``) into a dict; raises SystemExit naming an unknown or malformed one."""
    options = {}
    for argument in argv:
        key, separator, value = argument.partition("=")
        if not separator or key not in KEYS or not value:
            raise SystemExit(f"yolo-fastdetect check: bad argument {argument!r} (expected one of "
                             f"{', '.join(k + '=...' for k in KEYS)})\n{USAGE}")
        options[key] = value
    return options


def main(argv: list[str]) -> int:
    """Run the check; returns the exit status (0: fast path active and detections equal to stock's)."""
    if argv[:1] and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    options = parse_arguments(argv)
    import torch

    device = options.get("device", "0" if torch.cuda.is_available() else "cpu")
    return run(options.get("model", "yolo11n.yaml"), device, options.get("source"), int(options.get("imgsz", 640)))


def _torch_device(device: str):
    import torch

    return torch.device(f"cuda:{device}" if device.isdigit() else device)


def _inactive_reason(torch_device) -> str | None:
    """Why the fast path cannot run on ``torch_device`` before anything is predicted, or None."""
    import yolo_fastdetect

    from . import _ext
    from .cli import patch_state

    if not yolo_fastdetect.is_enabled():
        return f"the patch is {patch_state()}"
    if not _ext.available():
        return f"the operators could not be built or loaded (log: {_ext._state['log']})"
    if torch_device.type == "cuda" and not _ext.has_cuda_kernels():
        return f"no CUDA kernels: {_ext.cuda_unavailable_reason()}"
    return None


def _kernels_run(predict) -> dict[str, bool]:
    """Which of ``KERNEL_OPERATORS`` one call of ``predict()`` dispatched (seen by a dispatch mode around that call;
    a first call of an input shape runs eagerly, so its operators reach the dispatcher)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = set()

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.name().split(".")[0])
            return func(*args, **(kwargs or {}))

    with Recorder():
        predict()
    return {kernel: operator in seen for kernel, operator in KERNEL_OPERATORS.items()}


def _first_images(source) -> list:
    """The first ``MAX_IMAGES`` images of ``source`` as stock's own loader reads them (BGR arrays), with no model
    run; every loader of Ultralytics 8.3 and 8.4 yields ``(paths, images, info)`` batches."""
    from ultralytics.data.build import load_inference_source

    batches = (images for _, images, _ in load_inference_source(source))
    return list(itertools.islice(itertools.chain.from_iterable(batches), MAX_IMAGES))


def _compare(stock_results, fast_results) -> tuple[bool, str]:
    """Whether ours equal stock's (counts and classes exactly, boxes and scores to 1e-3), and a line saying so."""
    boxes = max_box = max_score = 0.0
    differing = []
    for index, (stock, fast) in enumerate(zip(stock_results, fast_results)):
        a, b = stock.boxes.data.cpu().double(), fast.boxes.data.cpu().double()
        boxes += len(a)
        if a.shape != b.shape or not (a[:, 5] == b[:, 5]).all():
            differing.append(f"image {index}: {len(a)} boxes stock, {len(b)} ours")
            continue
        if len(a):
            max_box = max(max_box, (a[:, :4] - b[:, :4]).abs().max().item())
            max_score = max(max_score, (a[:, 4] - b[:, 4]).abs().max().item())
    equal = not differing and max_box <= 1e-3 and max_score <= 1e-3
    summary = (f"{'equal to' if equal else 'DIFFERENT from'} stock on {len(stock_results) - len(differing)}/"
               f"{len(stock_results)} images ({int(boxes)} boxes; classes equal; max box difference {max_box:.2e} px, "
               f"max score difference {max_score:.2e})")
    return equal, summary + "".join(f"\n    {line}" for line in differing)


def _ms_per_image(model, images: list, batch: int, device: str, imgsz: int, cuda: bool) -> float:
    """Median ms per image of ``model.predict`` on ``batch`` of ``images`` (repeated to fill it), after warm-up."""
    import torch

    chunk = [images[i % len(images)] for i in range(batch)]
    warmup, repeats = (3, 10 if batch == 1 else 5) if cuda else (1, 3 if batch == 1 else 2)
    samples = []
    for call in range(warmup + repeats):
        begin = time.perf_counter()
        model.predict(chunk, batch=batch, device=device, imgsz=imgsz, verbose=False)
        if cuda:
            torch.cuda.synchronize()
        if call >= warmup:
            samples.append((time.perf_counter() - begin) * 1e3 / batch)
    return statistics.median(samples)


def run(model_name: str, device: str, source: str | None, imgsz: int) -> int:
    """Check ``model_name`` on ``device``; prints the table and returns the exit status."""
    import torch
    from ultralytics.utils import ASSETS

    import yolo_fastdetect

    from . import _ext, graphs
    from .bench._timing import detecting_model
    from .cli import gpu_state, version_line

    torch_device = _torch_device(device)
    cuda = torch_device.type == "cuda"
    print(version_line())
    if cuda and not (torch.cuda.is_available() and (torch_device.index or 0) < torch.cuda.device_count()):
        print(f"FAIL: device={device} asks for a CUDA device, and torch sees {torch.cuda.device_count()} of them")
        return 1
    print(f"device: {torch.cuda.get_device_name(torch_device) if cuda else 'CPU'} ({torch_device}); "
          f"on the GPU: {gpu_state()}")
    reason = _inactive_reason(torch_device)
    if reason is not None:
        print(f"FAIL: the fast path is not active on {torch_device}: {reason}")
        return 1

    sources = source or [str(ASSETS / "bus.jpg"), str(ASSETS / "zidane.jpg")]
    images = _first_images(sources)
    if not images:
        print(f"FAIL: the source {source!r} gave no images")
        return 1
    stock_model, fast_model = (detecting_model(model_name) for _ in range(2))
    arguments = {"device": device, "imgsz": imgsz, "verbose": False}
    kernels = _kernels_run(lambda: fast_model.predict(images[:1], **arguments))
    fast_results = [fast_model.predict(image, **arguments)[0] for image in images]
    with yolo_fastdetect.disabled():
        stock_results = [stock_model.predict(image, **arguments)[0] for image in images]
    equal, summary = _compare(stock_results, fast_results)
    speed = []
    for batch in (1, MAX_IMAGES):
        with yolo_fastdetect.disabled():
            stock_ms = _ms_per_image(stock_model, images, batch, device, imgsz, cuda)
        fast_ms = _ms_per_image(fast_model, images, batch, device, imgsz, cuda)
        speed.append(f"batch {batch}: stock {stock_ms:.2f}, ours {fast_ms:.2f} ({stock_ms / fast_ms:.2f}x)")
    if cuda:  # a shape's forward is captured on its second call: by now, if ever
        kernels["graphs"] = len(graphs.default_cache()) > 0
    ran = " | ".join(f"{name} {'yes' if done else 'no'}" for name, done in kernels.items())
    print(f"kernels on {torch_device}: {ran}{'' if cuda else ' (letterbox and graphs: GPU only)'}")
    print(f"detections ({len(images)} images, {model_name}, imgsz {imgsz}): {summary}")
    print(f"ms/img, model.predict end to end: {' | '.join(speed)}")

    missing = [name for name in REQUIRED_KERNELS if not kernels[name]]
    if missing:
        reason = _ext.cuda_unavailable_reason() if cuda else None
        print(f"FAIL: {', '.join(missing)} ran stock on {torch_device}{f' ({reason})' if reason else ''}")
        return 1
    if not equal:
        print("FAIL: the detections differ from stock's")
        return 1
    print(f"OK: the fast path runs on {torch_device} with stock's detections")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
