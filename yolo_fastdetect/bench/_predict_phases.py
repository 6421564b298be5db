"""Where one ``model.predict`` pass's wall time goes on the predictor's thread: waiting for its source's next batch,
Ultralytics' own stages (``Results.speed``: preprocess, inference, postprocess), and the rest (the results handed
to the caller, the caller's own work, the loop's Python).

On a GPU (and for a model that asks for it) Ultralytics 8.4.1xx reads a file source's batches on one more thread
(``ultralytics.engine.predictor._prefetch``) while the predictor runs the batch before: the predictor's thread then
waits only where the source is slower than the rest of the loop. A pass timed here tells the two apart: waits near
zero mean the predictor's thread bounds the pass, long waits the source.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from unittest import mock

import torch

PREDICT_PHASES = ("batch waits", "preprocess", "inference", "postprocess", "rest")


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

    def timed(iterator):
        waited.prefetched = True
        items = stock(iterator)
        try:
            while True:
                asked = time.perf_counter()
                try:
                    item = next(items)
                except StopIteration:
                    return
                finally:
                    waited.seconds += time.perf_counter() - asked
                yield item
        finally:  # the predictor closes this generator when it stops: stop stock's worker with it
            items.close()

    with mock.patch.object(predictor, "_prefetch", timed):
        yield waited


def predict_phases(model, source, batch: int, options: dict) -> dict[str, float | None]:
    """One ``stream=True`` pass of ``model.predict(source)``, consumed as the benchmarks consume it (each result's
    boxes to the host): microseconds per frame of each of :data:`PREDICT_PHASES` (``batch waits`` None where it
    cannot be told), which add up to the pass's wall time per frame."""
    speeds = []
    with batch_waits() as waited:
        begin = time.perf_counter()
        for result in model.predict(source, stream=True, batch=batch, **options):
            result.boxes.cpu()
            speeds.append(result.speed)
        if options["device"] == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - begin
    frames = max(1, len(speeds))
    phases: dict[str, float | None] = {"batch waits": waited.seconds * 1e6 / frames if waited.prefetched else None}
    for stage in PREDICT_PHASES[1:4]:
        phases[stage] = sum(speed[stage] for speed in speeds) * 1e3 / frames
    phases["rest"] = wall * 1e6 / frames - sum(value or 0.0 for value in phases.values())
    return phases
