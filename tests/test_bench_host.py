"""The benchmarks' account of the rest of the host (``bench/_host.py``): other processes' CPU and stolen time,
from ``/proc/stat`` and ``os.times``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from yolo_fastdetect.bench._host import HostActivity, HostCpuTimes, host_activity, host_cpu_times

LINUX = Path("/proc/stat").exists()


def test_activity_is_the_hosts_busy_time_less_this_processs():
    first = HostCpuTimes(busy=100.0, steal=1.0, own=10.0, wall=50.0)
    last = HostCpuTimes(busy=112.5, steal=1.4, own=12.5, wall=55.0)
    assert host_activity(first, last, cores=8) == HostActivity(other_cores=2.0, steal_percent=1.0)


def test_no_activity_without_both_samples_or_time():
    sample = HostCpuTimes(busy=1.0, steal=0.0, own=1.0, wall=5.0)
    assert host_activity(None, sample) is None and host_activity(sample, None) is None
    assert host_activity(sample, sample) is None


def test_own_time_above_the_hosts_counts_as_no_other_process():
    """``os.times`` and ``/proc/stat`` tick apart: this process's time may read a tick above the host's."""
    first = HostCpuTimes(busy=10.0, steal=0.0, own=1.0, wall=0.0)
    last = HostCpuTimes(busy=10.5, steal=0.0, own=1.6, wall=1.0)
    assert host_activity(first, last, cores=2).other_cores == 0.0


def test_unreadable_stat_gives_none(tmp_path):
    assert host_cpu_times(tmp_path / "absent") is None
    (tmp_path / "stat").write_text("intr 1 2 3\n")
    assert host_cpu_times(tmp_path / "stat") is None


@pytest.mark.skipif(not LINUX, reason="/proc/stat is Linux's")
def test_a_busy_child_process_is_not_another_process():
    """A child that spins and is reaped counts as this process's (stock's validation workers are children); what
    other processes of the host did meanwhile is not asserted (a shared machine's other work is not ours to know)."""
    first = host_cpu_times()
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                                          "while time.process_time() < end: pass"], check=True)
    last = host_cpu_times()
    assert last.own - first.own >= 0.45  # the child's CPU, reaped


@pytest.mark.skipif(not LINUX, reason="/proc/stat is Linux's")
def test_an_unrelated_busy_process_counts_as_other():
    """A process this one does not reap (still running when the interval ends) counts as the host's other work."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # the interpreter's start-up, then spinning
        first = host_cpu_times()
        time.sleep(1.0)
        last = host_cpu_times()
    finally:
        spinner.kill()
        spinner.wait()
    assert host_activity(first, last).other_cores >= 0.4  # a core's worth, less what a busy machine takes from it
