"""Patch ``ops.Profile.time``: a CUDA stage timer waits for its own stream's work, not the whole GPU's.

Ultralytics times the predictor's and the validator's stages with ``ops.Profile``, which synchronizes the device
on entering and leaving each stage: six device-wide waits for each predicted batch. Stock queues all its work on one
stream, so that is a wait for the stage's own work. The package's video readers convert the frames of later
batches on streams of their own (PyAV's planes, NVDEC), and a device-wide wait also waits for those: the predictor's
thread then stands idle while the readers' copies run. The patched timer synchronizes the device's current stream,
where the stage queued its work: the same wait as stock's where one stream is in use, and none for the readers'
streams. Timers of other devices, and a CPU's, run stock's method.

The plan checks behaviour: stock's timer must read ``time.perf_counter`` and tell a CUDA timer by its ``accelerator``
(8.4) or ``cuda`` (8.3) attribute.
"""

from __future__ import annotations

import time as clock

import torch
from ultralytics.utils import ops

from ._patching import Patch, Replacement, parameters, require


def _times_cuda(profile: ops.Profile) -> bool:
    """Whether stock's ``profile.time()`` synchronizes a CUDA device."""
    return getattr(profile, "accelerator", None) is torch.cuda or getattr(profile, "cuda", False) is True


def time(self: ops.Profile) -> float:
    """Stock's ``Profile.time``, waiting for the current CUDA stream of the timer's device rather than the device."""
    if not _times_cuda(self):
        return PATCH.original("time")(self)
    torch.cuda.current_stream(self.device).synchronize()
    return clock.perf_counter()


def _plan() -> list[Replacement]:
    """``time(self)`` on ``ops.Profile``: ``perf_counter`` after a CUDA timer's synchronization."""
    stock = getattr(ops.Profile, "time", None)
    require(callable(stock) and parameters(stock) == ["self"], "ops.Profile.time is not (self)")
    before = clock.perf_counter()
    measured = stock(ops.Profile(device=torch.device("cpu")))
    require(isinstance(measured, float) and before <= measured <= clock.perf_counter(),
            "ops.Profile.time does not read time.perf_counter")
    require(_times_cuda(ops.Profile(device=torch.device("cuda", 0))),
            "ops.Profile tells a CUDA timer by neither .accelerator nor .cuda")
    require(not _times_cuda(ops.Profile(device=torch.device("cpu"))), "ops.Profile takes a CPU timer for a CUDA one")
    return [Replacement(ops.Profile, "time", time)]


PATCH = Patch(
    "profile_sync",
    "ops.Profile(device).time() synchronizing a CUDA device, then reading time.perf_counter",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
