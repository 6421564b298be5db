"""What the rest of the host did while a benchmark timed: the CPU time of other processes and the time the
hypervisor stole, so that a reader can tell a run on a busy or shared machine from a run on a quiet one.

On the GPU machines a run just after a cold start and the operators' build took every step two to five times its
usual length, stock's and ours alike, and the speed-ups came out far lower; a run minutes later on the same machine
did not (docs/design.md, Validation). Linux only: ``/proc/stat`` gives the host's CPU time, ``os.times``
this process's and its reaped children's (stock's validation workers are forked children, reaped when their loader
is collected; a child still running when the interval ends counts among the other processes).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class HostCpuTimes:
    """Seconds since boot, all cores together: ``busy`` (user, nice, system, irq, softirq) and ``steal``; this
    process's CPU seconds with its reaped children's (``own``); the wall clock (``wall``)."""

    busy: float
    steal: float
    own: float
    wall: float


def host_cpu_times(stat: Path = PROC_STAT) -> HostCpuTimes | None:
    """The host's and this process's CPU times now, or None where ``stat`` cannot be read (not Linux).

    Examples:
        >>> isinstance(host_cpu_times(), (HostCpuTimes, type(None)))
        True
    """
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[1:9])
    ticks = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return HostCpuTimes(busy=(user + nice + system + irq + softirq) / ticks, steal=steal / ticks,
                        own=own.user + own.system + own.children_user + own.children_system,
                        wall=time.monotonic())


@dataclass(frozen=True)
class HostActivity:
    """Between two :class:`HostCpuTimes`: cores' worth of CPU the other processes used, and the share of the host's
    cores the hypervisor stole, in percent."""

    other_cores: float
    steal_percent: float

    def line(self) -> str:
        """One line for a benchmark's log.

        Examples:
            >>> HostActivity(0.04, 0.0).line()
            'other processes 0.04 cores, stolen 0.0 %'
        """
        return f"other processes {self.other_cores:.2f} cores, stolen {self.steal_percent:.1f} %"

    def figures(self) -> dict[str, float]:
        """The figures a benchmark record carries (RESULTS renders them).

        Examples:
            >>> HostActivity(0.04, 0.0).figures()
            {'host_other_cores': 0.04, 'host_steal_percent': 0.0}
        """
        return {"host_other_cores": self.other_cores, "host_steal_percent": self.steal_percent}


def host_activity(first: HostCpuTimes | None, last: HostCpuTimes | None,
                  cores: int | None = None) -> HostActivity | None:
    """What the host did from ``first`` to ``last`` besides this process (None where either is None or no time
    passed); ``cores`` defaults to ``os.cpu_count()``.

    Examples:
        >>> first = HostCpuTimes(busy=10.0, steal=0.0, own=2.0, wall=100.0)
        >>> last = HostCpuTimes(busy=16.0, steal=0.8, own=6.0, wall=102.0)
        >>> host_activity(first, last, cores=4)
        HostActivity(other_cores=1.0, steal_percent=10.0)
    """
    if first is None or last is None or last.wall <= first.wall:
        return None
    wall = last.wall - first.wall
    others = max(0.0, (last.busy - first.busy) - (last.own - first.own))
    cores = cores or os.cpu_count() or 1
    return HostActivity(other_cores=round(others / wall, 2),
                        steal_percent=round(100 * (last.steal - first.steal) / (wall * cores), 1))
