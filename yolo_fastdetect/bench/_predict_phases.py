"""Where one ``model.predict`` pass's wall time goes on the predictor's thread: waiting for its source's next batch,
Ultralytics' own stages (``Results.speed``: preprocess, inference, postprocess), and the rest (the results handed
to the caller, the caller's own work, the loop's Python).

On a GPU (and for a model that asks for it) Ultralytics 8.4.1xx reads a file source's batches on one more thread
(``ultralytics.engine.predictor._prefetch``) while the predictor runs the batch before: the predictor's thread then
waits only where the source is slower than the rest of the loop. A pass timed here tells the two apart: waits near
zero mean the predictor's thread bounds the pass, long waits the source. :func:`reader_times` then tells where the
video readers' threads spend theirs: in the decoder (PyAV's or NVDEC's frames, converted on the GPU), and waiting
for room in their queues (the consumer is behind). :data:`OFF_CPU` tells which of those threads' time is spent off the
CPU: with CUDA's default scheduling a thread waiting for the GPU spins (on the CPU), so off-CPU time is time blocked
on a lock (the GIL, a queue's), asleep or in the kernel's waits, and a thread whose off-CPU time far exceeds its queue
waits waits for the GIL.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from unittest import mock

import torch

PREDICT_PHASES = ("batch waits", "preprocess", "inference", "postprocess", "rest")
# Thread-seconds of the video readers (sources/video.py), summed over their threads: waiting on the GPU-converting
# decoder for each frame (PyAV's decode and staging, or NVDEC's; the GPU conversion and the copy back included), the
# part of it in PyAV's batched conversion (PlanesVideo._converted), and waiting for room in the reader's queue.
READER_PHASES = ("converted decoder", "of which GPU conversion", "queue waits")
# Wall time less thread CPU time (time.thread_time): the predictor's thread over the pass, and the video readers'
# threads over their lives (summed).
OFF_CPU = ("predictor", "readers")


def _each_next_timed(items: Iterator, count: Callable[[float], None]) -> Iterator:
    """``items``, the seconds each ``next`` of it takes given to ``count``; closing this closes ``items`` (the
    predictor closes its batches when it stops: stock's prefetch worker stops with them)."""
    try:
        while True:
            begin = time.perf_counter()
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                count(time.perf_counter() - begin)
            yield item
    finally:
        items.close()


@dataclass
class BatchWaits:
    """What :func:`batch_waits` counted: the seconds waited, and whether a pass read its batches through
    ``_prefetch`` at all (where not, the waits are the predictor's own reads, not told apart)."""

    seconds: float = 0.0
    prefetched: bool = False


@contextlib.contextmanager
def batch_waits() -> Iterator[BatchWaits]:
    """Count the seconds the predictor's thread waits on ``_prefetch`` for its next batch in the block (Ultralytics
    releases without ``_prefetch``: none counted, ``prefetched`` stays False).

    Examples:
        >>> from ultralytics.engine import predictor
        >>> with batch_waits() as waited:
        ...     list(predictor._prefetch(iter([1, 2])))
        [1, 2]
        >>> waited.prefetched and waited.seconds >= 0
        True
    """
    from ultralytics.engine import predictor

    waited = BatchWaits()
    stock = getattr(predictor, "_prefetch", None)
    if not callable(stock):
        yield waited
        return

    def waited_for(seconds: float) -> None:
        waited.seconds += seconds

    def timed(iterator):
        waited.prefetched = True
        return _each_next_timed(stock(iterator), waited_for)

    with mock.patch.object(predictor, "_prefetch", timed):
        yield waited


def predict_phases(model, source, batch: int, options: dict
                   ) -> tuple[dict[str, float | None], dict[str, float], dict[str, float]]:
    """One ``stream=True`` pass of ``model.predict(source)``, consumed as the benchmarks consume it (each result's
    boxes to the host): microseconds per frame of each of :data:`PREDICT_PHASES` (``batch waits`` None where it
    cannot be told), which add up to the pass's wall time per frame; of each of :data:`READER_PHASES` (thread
    time of the video readers); and of each of :data:`OFF_CPU`."""
    speeds = []
    with batch_waits() as waited, reader_times() as readers, readers_off_cpu() as readers_off:
        begin, begin_cpu = time.perf_counter(), time.thread_time()
        for result in model.predict(source, stream=True, batch=batch, **options):
            result.boxes.cpu()
            speeds.append(result.speed)
        if options["device"] == "cuda":
            torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - begin, time.thread_time() - begin_cpu
    frames = max(1, len(speeds))
    phases: dict[str, float | None] = {"batch waits": waited.seconds * 1e6 / frames if waited.prefetched else None}
    for stage in PREDICT_PHASES[1:4]:
        phases[stage] = sum(speed[stage] for speed in speeds) * 1e3 / frames
    phases["rest"] = wall * 1e6 / frames - sum(value or 0.0 for value in phases.values())
    off_cpu = {"predictor": max(0.0, wall - cpu) * 1e6 / frames, "readers": readers_off[0] * 1e6 / frames}
    return phases, {phase: seconds * 1e6 / frames for phase, seconds in readers.items()}, off_cpu


@contextlib.contextmanager
def readers_off_cpu() -> Iterator[list[float]]:
    """Sum the seconds the video readers' threads started in the block spend off the CPU over their lives (wall time
    less ``time.thread_time``): a one-item list, complete once those threads have ended.

    Examples:
        >>> with readers_off_cpu() as seconds:
        ...     pass
        >>> seconds
        [0.0]
    """
    from yolo_fastdetect.sources import video

    total = [0.0]
    lock = threading.Lock()
    read_all = video._read_all

    @functools.wraps(read_all)
    def counted(*args, **kwargs):
        begin, begin_cpu = time.perf_counter(), time.thread_time()
        try:
            return read_all(*args, **kwargs)
        finally:
            off = (time.perf_counter() - begin) - (time.thread_time() - begin_cpu)
            with lock:
                total[0] += max(0.0, off)

    with mock.patch.object(video, "_read_all", counted):
        yield total


@contextlib.contextmanager
def reader_times() -> Iterator[dict[str, float]]:
    """Count the video readers' thread-seconds in the block at each of :data:`READER_PHASES` (a dict, growing as the
    block runs; summed over the readers' threads, so it can exceed the wall time). cv2's reads count only in
    ``queue waits``.

    Examples:
        >>> with reader_times() as times:
        ...     pass
        >>> sorted(times) == sorted(READER_PHASES)
        True
    """
    from yolo_fastdetect.sources import av_planes, nvdec, video

    times = dict.fromkeys(READER_PHASES, 0.0)
    lock = threading.Lock()

    def counted(phase: str, seconds: float) -> None:
        with lock:
            times[phase] += seconds

    def timed(phase: str, function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            begin = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                counted(phase, time.perf_counter() - begin)

        return call

    def timed_frames(iterate):
        @functools.wraps(iterate)
        def frames(self):
            return _each_next_timed(iterate(self), functools.partial(counted, READER_PHASES[0]))

        return frames

    with contextlib.ExitStack() as stack:
        for decoder in (av_planes.PlanesVideo, nvdec.NvdecVideo):
            stack.enter_context(mock.patch.object(decoder, "__iter__", timed_frames(decoder.__iter__)))
        stack.enter_context(mock.patch.object(av_planes.PlanesVideo, "_converted",
                                              timed(READER_PHASES[1], av_planes.PlanesVideo._converted)))
        stack.enter_context(mock.patch.object(video, "put_unless_stopped",
                                              timed(READER_PHASES[2], video.put_unless_stopped)))
        yield times
