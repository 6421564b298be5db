"""Items handed from a producer thread to its consumer through a bounded queue, where either side may stop: the
producer's put gives up once the consumer has stopped, the consumer's get gives up once the producer's thread has
ended with nothing left. Used by the video reader (:mod:`.video`) and the segment decoders (:mod:`.gop_segments`).
"""

from __future__ import annotations

import queue
import threading

__all__ = ["POLL_S", "drain", "get_from", "put_unless_stopped"]

# How often a blocked producer or consumer looks whether the other side has stopped (seconds).
POLL_S = 0.05


def put_unless_stopped(items: queue.Queue, stop: threading.Event, item) -> bool:
    """Put ``item`` once there is room; False when ``stop`` was set first (the consumer stopped)."""
    while not stop.is_set():
        try:
            items.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def get_from(items: queue.Queue, producer: threading.Thread, stopped: str):
    """The next item; RuntimeError(``stopped``) where ``producer`` has ended and left none. Never blocks once the
    producer has ended."""
    while True:
        try:
            return items.get(timeout=POLL_S)
        except queue.Empty:
            if not producer.is_alive() and items.empty():
                raise RuntimeError(stopped) from None


def drain(items: queue.Queue) -> None:
    """Drop what ``items`` holds now (the consumer stopped: the items go now, not with the last reference)."""
    while True:
        try:
            items.get_nowait()
        except queue.Empty:
            return
