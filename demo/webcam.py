#!/usr/bin/env python3
"""Live detection demo: a webcam, video file, RTSP/HTTP stream or image folder through a patched YOLO model.

    python demo/webcam.py --source 0 --model yolo12n.pt
    python demo/webcam.py --source clip.mp4 --headless --output out.mp4 --frames 300

Each frame is read with OpenCV, run through the Ultralytics model (on the GPU when there is one) and drawn with its
boxes, the FPS and the latency of each stage: capture (timed here), then preprocess, inference and post-process
(Ultralytics' ``Results.speed``). A frame's time, from which the FPS comes, runs from capture to the drawn frame;
writing the video and showing the window are left out. Keys in the window: ``q`` quits, ``p`` switches the
yolo_fastdetect patch on and off live (the overlay says which mode runs), ``s`` saves the frame.
At the end one summary line per mode is printed (headless runs have one mode). A source or a model that cannot be
opened ends the demo with one message and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

IMAGE_SUFFIXES = {".bmp", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp"}
STAGES = ("capture", "preprocess", "inference", "postprocess")
STAGE_LABELS = {"capture": "capture", "preprocess": "pre", "inference": "infer", "postprocess": "post"}  # on screen
OVERLAY_WINDOW = 30  # frames averaged for the numbers drawn on screen
WINDOW_NAME = "yolo_fastdetect demo"


class DemoError(Exception):
    """A problem the user can fix (bad source, model, display): reported in one line with exit code 2."""


# ---------------------------------------------------------------------------------------------------------------
# Frame sources


class VideoSource:
    """A camera index, a video file or a stream URL, read with ``cv2.VideoCapture``."""

    def __init__(self, target: int | str, description: str):
        self.description = description
        # OpenCV logs several lines of its own when a device or file cannot be opened; our message says it once.
        log_level = cv2.utils.logging.getLogLevel()
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
        try:
            self.capture = cv2.VideoCapture(target)
        finally:
            cv2.utils.logging.setLogLevel(log_level)
        if not self.capture.isOpened():
            raise DemoError(f"cannot open {description}")
        self.fps = self.capture.get(cv2.CAP_PROP_FPS) or 30.0

    def read(self) -> np.ndarray | None:
        """The next BGR frame, or None at the end of the source."""
        ok, frame = self.capture.read()
        return frame if ok else None

    def close(self) -> None:
        self.capture.release()


class ImageSource:
    """The images of a folder (in name order) or a single image file, one frame each."""

    fps = 1.0  # frame rate of a video written from stills

    def __init__(self, paths: list[Path], description: str):
        if not paths:
            raise DemoError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in {description}")
        self.paths = iter(paths)
        self.description = description

    def read(self) -> np.ndarray | None:
        """The next readable image, or None when none is left."""
        for path in self.paths:
            image = cv2.imread(str(path))
            if image is not None:
                return image
        return None

    def close(self) -> None:
        pass


def open_source(spec: str) -> VideoSource | ImageSource:
    """Open ``--source``: a camera index, an rtsp/http(s) URL, an image folder, an image or a video file."""
    if spec.isdigit():
        return VideoSource(int(spec), f"camera {spec} (is a webcam connected, and free?)")
    if "://" in spec:
        return VideoSource(spec, f"stream {spec}")
    path = Path(spec)
    if path.is_dir():
        images = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        return ImageSource(images, f"folder {path}")
    if path.is_file():
        if path.suffix.lower() in IMAGE_SUFFIXES:
            return ImageSource([path], f"image {path}")
        return VideoSource(str(path), f"video {path} (not a video OpenCV can read)")
    raise DemoError(f"source not found: {spec} (give a camera index, a URL, a video, an image or a folder)")


# ---------------------------------------------------------------------------------------------------------------
# Timing


@dataclass
class ModeTimings:
    """Per-frame latencies in milliseconds of one mode (patched or stock): each stage and the whole frame."""

    frames: list[dict[str, float]] = field(default_factory=list)

    def add(self, **stage_ms: float) -> None:
        self.frames.append(stage_ms)

    def mean_ms(self, stage: str, last: int | None = None) -> float:
        frames = self.frames[-last:] if last else self.frames
        return statistics.fmean(frame[stage] for frame in frames)

    def fps(self, last: int | None = None) -> float:
        """Frames per second from the mean frame time (of the ``last`` frames, if given)."""
        return 1000.0 / self.mean_ms("frame", last)

    def median_fps(self) -> float:
        return 1000.0 / statistics.median(frame["frame"] for frame in self.frames)

    def summary(self, mode: str) -> str:
        stages = ", ".join(f"{stage} {self.mean_ms(stage):.1f}" for stage in STAGES)
        return (f"{len(self.frames)} frames, {mode}: mean {self.fps():.1f} FPS, median {self.median_fps():.1f} FPS "
                f"(mean ms: {stages})")


# ---------------------------------------------------------------------------------------------------------------
# Model and drawing


def load_model(name: str):
    """The Ultralytics model ``name`` (a .pt checkpoint or a .yaml architecture with random weights)."""
    from ultralytics import YOLO

    try:
        return YOLO(name)
    except Exception as error:  # noqa: BLE001 - any load failure is the user's model argument; say so in one line
        raise DemoError(f"cannot load model {name}: {type(error).__name__}: {error}") from None


def fp16_option() -> dict:
    """The predict argument for fp16: ``quantize=16`` where this Ultralytics has it (it deprecates ``half``)."""
    from ultralytics.cfg import DEFAULT_CFG_DICT

    return {"quantize": 16} if "quantize" in DEFAULT_CFG_DICT else {"half": True}


def patch_mode() -> str:
    import yolo_fastdetect

    return "patched" if yolo_fastdetect.is_enabled() else "stock"


def set_patch(on: bool) -> None:
    """Switch the yolo_fastdetect patch; the running predictor uses the new mode from its next frame."""
    import yolo_fastdetect

    if on:
        yolo_fastdetect.enable()
    else:
        yolo_fastdetect.disable()


def draw_overlay(image: np.ndarray, mode: str, timings: ModeTimings, device: str, keys_help: bool) -> None:
    """Write the mode, FPS and per-stage latency (means of the last frames) in the top-left corner."""
    stage_text = "  ".join(f"{STAGE_LABELS[stage]} {timings.mean_ms(stage, OVERLAY_WINDOW):.1f}" for stage in STAGES)
    lines = [f"yolo_fastdetect: {mode}", f"{timings.fps(OVERLAY_WINDOW):.1f} FPS on {device}", f"{stage_text} ms"]
    if keys_help:
        lines.append("q quit  p patch on/off  s save")
    scale = max(0.5, image.shape[1] / 1600)
    line_height = int(30 * scale)
    width = int(max(cv2.getTextSize(line, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][0] for line in lines)) + 20
    cv2.rectangle(image, (0, 0), (width, line_height * len(lines) + 10), (0, 0, 0), -1)
    colour = (80, 220, 80) if mode == "patched" else (0, 165, 255)  # BGR: green patched, orange stock
    for row, line in enumerate(lines, start=1):
        cv2.putText(image, line, (10, row * line_height), cv2.FONT_HERSHEY_SIMPLEX, scale, colour, 1, cv2.LINE_AA)


def save_frame(image: np.ndarray, index: int, save_dir: Path) -> None:
    save_dir.mkdir(parents=True, exist_ok=True)
    path = save_dir / f"frame_{index:05d}.jpg"
    cv2.imwrite(str(path), image)
    print(f"saved {path}")


def open_writer(path: Path, fps: float, frame: np.ndarray) -> cv2.VideoWriter:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (frame.shape[1], frame.shape[0]))
    if not writer.isOpened():
        raise DemoError(f"cannot write the output video {path}")
    return writer


# ---------------------------------------------------------------------------------------------------------------
# The demo


def counted(minimum: int):
    """An argparse type: an int of at least ``minimum``."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="0", help="camera index, video file, rtsp/http URL, image or folder")
    parser.add_argument("--model", default="yolo12n.pt", help="Ultralytics model (.pt, or .yaml for random weights)")
    parser.add_argument("--device", help="torch device (default: GPU 0 if there is one, else cpu)")
    parser.add_argument("--imgsz", type=int, default=640, help="inference size")
    parser.add_argument("--conf", type=float, default=0.25, help="confidence threshold")
    parser.add_argument("--half", action="store_true", help="fp16 inference (GPU only)")
    parser.add_argument("--stock", action="store_true", help="start with the patch off (p switches it on)")
    parser.add_argument("--headless", action="store_true", help="no window: for servers and CI")
    parser.add_argument("--output", type=Path, help="write the annotated video here (.mp4)")
    parser.add_argument("--frames", type=counted(1), help="stop after this many frames")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs on the first frame, in each mode")
    parser.add_argument("--save-frame", type=counted(0), action="append", default=[], metavar="INDEX",
                        help="save annotated frame INDEX (0-based) as a JPEG; repeatable; the s key does it live")
    parser.add_argument("--save-dir", type=Path, default=Path("."), help="folder for saved frames")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> None:
    """Open the source, load the model, then capture -> predict -> draw -> show/write until the end or ``q``."""
    if not args.headless and sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    ):
        raise DemoError("no display to open a window on: add --headless (and --output FILE.mp4)")
    # The source is opened before the (slow) model imports, so that a wrong source fails at once.
    source = open_source(args.source)
    capture_start = time.perf_counter()
    frame = source.read()
    capture_ms = (time.perf_counter() - capture_start) * 1000
    if frame is None:
        raise DemoError(f"cannot read a frame from {source.description}")

    import torch

    import yolo_fastdetect  # noqa: F401 - importing patches Ultralytics

    model = load_model(args.model)
    device = args.device or ("0" if torch.cuda.is_available() else "cpu")
    if device != "cpu" and not device.startswith("mps") and not torch.cuda.is_available():
        raise DemoError(f"--device {device}: torch sees no CUDA GPU here (use --device cpu)")
    predict_options = dict(imgsz=args.imgsz, conf=args.conf, device=device, verbose=False)
    if args.half and device != "cpu":
        predict_options.update(fp16_option())
    # Warm up both modes on the first frame: predictor set-up, operator build/load, cuDNN autotuning.
    for patched in (True, False):
        set_patch(patched)
        for _ in range(args.warmup):
            model.predict(frame, **predict_options)
    set_patch(not args.stock)

    timings = {"patched": ModeTimings(), "stock": ModeTimings()}
    writer, output_size = None, None
    index = 0
    try:
        while frame is not None and (args.frames is None or index < args.frames):
            processing_start = time.perf_counter()
            result = model.predict(frame, **predict_options)[0]
            annotated = result.plot()
            frame_ms = capture_ms + (time.perf_counter() - processing_start) * 1000
            mode = patch_mode()
            timings[mode].add(capture=capture_ms, **result.speed, frame=frame_ms)
            draw_overlay(annotated, mode, timings[mode], device, keys_help=not args.headless)

            if args.output:
                if writer is None:
                    writer, output_size = open_writer(args.output, source.fps, annotated), annotated.shape[1::-1]
                # A video has one frame size; images of a folder may differ.
                writer.write(annotated if annotated.shape[1::-1] == output_size else cv2.resize(annotated, output_size))
            if index in args.save_frame:
                save_frame(annotated, index, args.save_dir)
            if not args.headless:
                cv2.imshow(WINDOW_NAME, annotated)
                key = cv2.waitKey(1) & 0xFF
                if key == ord("q"):
                    break
                if key == ord("p"):
                    set_patch(mode == "stock")
                if key == ord("s"):
                    save_frame(annotated, index, args.save_dir)

            index += 1
            capture_start = time.perf_counter()
            frame = source.read()
            capture_ms = (time.perf_counter() - capture_start) * 1000
    except KeyboardInterrupt:
        pass  # Ctrl-C ends the run like q: the summary still follows
    finally:
        source.close()
        if writer is not None:
            writer.release()
        if not args.headless:
            cv2.destroyAllWindows()

    for missed in sorted(i for i in set(args.save_frame) if i >= index):
        print(f"webcam demo: frame {missed} not saved: the run ended after {index} frames", file=sys.stderr)
    for mode, mode_timings in timings.items():
        if mode_timings.frames:
            print(f"webcam demo: {mode_timings.summary(mode)}, device {device}"
                  + (f", output {args.output}" if args.output else ""))


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 on success, 2 (with one message on stderr) when the source or model cannot be used."""
    try:
        run(parse_args(argv))
    except DemoError as error:
        print(f"webcam demo: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
