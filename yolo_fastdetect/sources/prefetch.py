"""Ordered, bounded read-ahead on a pool of threads: the machinery under the image loaders.

Decoding a JPEG with OpenCV or Pillow releases the GIL, so threads decode in parallel while the predictor's thread
runs the GPU. :class:`OrderedPrefetch` keeps at most ``window`` items in flight and returns the results in the
items' order, so memory stays bounded on a source of any length and a consumer sees exactly the serial order. For
a predictor on a GPU its threads run at a lower priority than the thread that makes them (Linux: nice +5,
:func:`_below_the_caller`).
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
_END = object()  # no more items
# Nice value the decoder threads of a GPU predictor add to their own (Linux). The predictor's thread holds the GIL
# between its GPU calls; a decoder thread that preempts it on a busy CPU stalls every Python thread. Measured ahead
# of no increment in one run, level within the spread between runs in another (see benchmarks/RESULTS.md, File
# sources). On a CPU predictor the network's own threads do the work, and the decoders would only lose their share.
DECODER_NICE_INCREMENT = 5


def _below_the_caller() -> None:
    """Raise the calling thread's nice value by :data:`DECODER_NICE_INCREMENT` (at most to 19), on Linux only: there
    a thread's nice value is its own, and ``os.setpriority(os.PRIO_PROCESS, native thread id, ...)`` sets it; on
    macOS that call would address a process, so nothing is done elsewhere. A refusal (OSError) is ignored.

    Run as each decoder thread's initializer, it starts from the nice value inherited from the thread that made it.
    """
    if not sys.platform.startswith("linux"):
        return
    thread_id = threading.get_native_id()
    try:
        nice = os.getpriority(os.PRIO_PROCESS, thread_id)
        os.setpriority(os.PRIO_PROCESS, thread_id, min(19, nice + DECODER_NICE_INCREMENT))
    except OSError:
        pass


def read_ahead_window(batch: int, threads: int, read_ahead: int) -> int:
    """Images a loader keeps decoding ahead of its consumer: ``read_ahead`` batches, and at least one per thread (so
    that batch 1 keeps every thread busy).

    Examples:
        >>> read_ahead_window(batch=1, threads=15, read_ahead=2)
        15
    """
    return max(read_ahead * batch, threads)


def _shut_down(executor: ThreadPoolExecutor, pending: deque[Future]) -> None:
    """Cancel what has not started and join the threads (what is running finishes: one decode at most each)."""
    for future in pending:
        future.cancel()
    pending.clear()
    executor.shutdown(wait=True, cancel_futures=True)


class OrderedPrefetch(Generic[Item, Result]):
    """``function(item)`` for each item, computed up to ``window`` items ahead on ``threads`` threads, returned in
    order. An exception raised by ``function`` is raised by the ``next()`` that reaches its item.

    The threads are owned by this object: they are joined when it is exhausted, on :meth:`close`, when a result
    raises, and when the object is garbage-collected. ``lower_priority``: they run
    :data:`DECODER_NICE_INCREMENT` nice steps below the caller (Linux; for a predictor on a GPU).

    Examples:
        >>> with OrderedPrefetch(str.upper, ["a", "b", "c"], threads=2, window=2) as upper:
        ...     list(upper)
        ['A', 'B', 'C']
    """

    def __init__(self, function: Callable[[Item], Result], items: Iterable[Item], threads: int, window: int,
                 lower_priority: bool = False):
        self._function = function
        self._items: Iterator[Item] = iter(items)
        self._window = max(1, window)
        self._pending: deque[Future] = deque()
        self._executor = ThreadPoolExecutor(max(1, threads), thread_name_prefix="yolo_fastdetect_decode",
                                            initializer=_below_the_caller if lower_priority else None)
        self._finalizer = weakref.finalize(self, _shut_down, self._executor, self._pending)
        self._fill()

    def _fill(self) -> None:
        while len(self._pending) < self._window:
            item = next(self._items, _END)
            if item is _END:
                return
            self._pending.append(self._executor.submit(self._function, item))

    def __iter__(self) -> OrderedPrefetch[Item, Result]:
        return self

    def __next__(self) -> Result:
        if not self._pending:
            self.close()
            raise StopIteration
        future = self._pending.popleft()
        self._fill()
        try:
            return future.result()
        except BaseException:  # the function's error, or KeyboardInterrupt while waiting: stop the threads first
            self.close()
            raise

    def close(self) -> None:
        """Stop reading ahead and join the threads (idempotent)."""
        self._finalizer()

    def __enter__(self) -> OrderedPrefetch[Item, Result]:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
