"""How soon a busy predictor's thread hands the GIL to a reader thread of ours that waits for it.

A reader thread gives up the GIL in each call into a decoder (cv2's ``grab`` and ``retrieve``, ``imread``, PyAV's
demux and decode) and must take it back when the call returns. While the predictor's thread runs Python
(Ultralytics' loop, the model's launches, the ``Results``), CPython makes it hand the GIL over only after the
switch interval, 5 ms by default, so beside a busy predictor every frame waits for the GIL a few times. On the
development machine a thread reading a 720p clip with cv2 fell from 419 to 62 frames/s beside a thread running
Python, and read 239 with an interval of 0.2 ms (docs/sources_design.md, "The GIL and the reader threads").

So while any loader of ours has threads running, the interpreter's switch interval is at most
``YOLO_FASTDETECT_SWITCH_INTERVAL_US`` microseconds (default 200; 0 leaves it alone), and the interval from before
comes back when the last of them ends, unless someone set another in between.

Examples:
    >>> release = shorter_switch_interval()  # a loader's threads start
    >>> release()  # they ended: the interval from before is back
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from .. import config

__all__ = ["SWITCH_INTERVAL_VARIABLE", "shorter_switch_interval"]

SWITCH_INTERVAL_VARIABLE = "YOLO_FASTDETECT_SWITCH_INTERVAL_US"

_lock = threading.Lock()
_holders = 0  # loaders whose threads run now
_before: float | None = None  # the interval when the first of them started
_ours: float | None = None  # the interval set then


def shorter_switch_interval() -> Callable[[], None]:
    """Shorten the interpreter's switch interval to ``YOLO_FASTDETECT_SWITCH_INTERVAL_US`` (where it is longer) for
    as long as the caller's threads run; returns the function to call, once or more, when they end."""
    microseconds = config.get(SWITCH_INTERVAL_VARIABLE)
    if microseconds == 0:
        return lambda: None
    global _holders, _before, _ours
    with _lock:
        if _holders == 0:
            _before = sys.getswitchinterval()
            sys.setswitchinterval(min(_before, microseconds / 1e6))
            _ours = sys.getswitchinterval()  # as the interpreter rounds it
        _holders += 1
    held = [True]

    def release() -> None:
        global _holders, _before, _ours
        with _lock:
            if not held[0]:
                return
            held[0] = False
            _holders -= 1
            if _holders == 0:
                if sys.getswitchinterval() == _ours:  # nobody changed it meanwhile
                    sys.setswitchinterval(_before)
                _before = _ours = None

    return release
