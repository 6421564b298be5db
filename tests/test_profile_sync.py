"""The ``profile_sync`` patch (``patches/profile_sync.py``): Ultralytics' stage timer waits for the work queued on the
current CUDA stream, as stock's does, and no longer for another stream's; a CPU timer is stock's."""

from __future__ import annotations

import time

import pytest
import torch
from ultralytics.utils import ops

from yolo_fastdetect.patches import profile_sync
from yolo_fastdetect.patches._patching import Patch

cuda = pytest.mark.cuda

# GPU cycles a sleeping kernel spins: about 0.1-0.2 s on a data-centre GPU (1-2 GHz), far above a timer's own cost.
SLEEP_CYCLES = 200_000_000


@pytest.fixture(autouse=True)
def patched_timer():
    """Each test runs with the patch applied; its state is restored after."""
    applied = profile_sync.is_applied()
    assert profile_sync.apply(), profile_sync.PATCH.state()
    yield
    (profile_sync.apply if applied else profile_sync.revert)()


def test_a_cpu_timer_times_as_stocks():
    profile = ops.Profile(device=torch.device("cpu"))
    with profile:
        time.sleep(0.02)
    assert 0.02 <= profile.dt < 1.0


def test_the_plan_is_refused_where_the_timer_does_not_tell_cuda(monkeypatch):
    """A release whose timer tells a CUDA device some other way keeps stock's timer."""
    monkeypatch.setattr(profile_sync, "_times_cuda", lambda profile: False)
    fresh = Patch("profile_sync", profile_sync.PATCH.requires, profile_sync._plan)
    assert not fresh.apply()
    assert "CUDA timer" in fresh.state()


def _seconds_entering(stream_of_work: str) -> float:
    """Seconds a CUDA timer's entry takes while a kernel sleeps on the current stream or on a side stream."""
    device = torch.device("cuda", 0)
    side = torch.cuda.Stream(device)
    torch.cuda.synchronize(device)
    with torch.cuda.stream(side if stream_of_work == "side" else torch.cuda.current_stream(device)):
        torch.cuda._sleep(SLEEP_CYCLES)
    begin = time.perf_counter()
    with ops.Profile(device=device):
        pass
    seconds = time.perf_counter() - begin
    torch.cuda.synchronize(device)
    return seconds


@cuda
def test_a_cuda_timer_waits_for_its_streams_work_only():
    """The timer's entry waits for a kernel on the current stream, as stock's, and not for one on another stream,
    which stock's device-wide wait did (checked by reverting the patch)."""
    sleep = _seconds_entering("current")
    assert sleep > 0.05  # the kernel's time: the timer waited for it
    assert _seconds_entering("side") < sleep / 5
    profile_sync.revert()
    assert _seconds_entering("side") > sleep / 2  # stock's device-wide wait
