"""Decoder processes, opt-in: image files decoded outside this process's GIL, the pixels handed back through shared
memory.

Decoder threads release the GIL while OpenCV decodes, but need it again between decodes, and the predictor's
thread holds it for much of each batch. On the H200 host (16 cores, bench sources' 256 JPEGs up to 4K), 15
threads decode 896 img/s alone, 268 img/s beside one thread running pure Python (669 with a 0.5 ms switch
interval), and a folder at batch 64 gets about half the decode-only rate under ``model.predict``. Processes do not
share the GIL: 15 decoded 795 img/s alone (a diagnostic at 28b203a, in benchmarks/RESULTS.md), and their rate does
not depend on what the predictor's thread does. Whether that wins end to end is measured by ``bench sources
--decode-processes N`` (and ``bench scale --decode-processes N`` for the Ray actors, :mod:`yolo_fastdetect.ray.decode`);
until then this is opt-in (``YOLO_FASTDETECT_DECODE_PROCESSES=N``, see :mod:`yolo_fastdetect.sources`).

Each worker (``_decoder_worker.py``) answers over a Unix socket pair with a memfd holding the image (descriptor
passing, so no named shared memory can leak); the parent maps it, and the numpy array owns the mapping. A worker
only takes files that Ultralytics' ``imread`` decodes with ``cv2.imdecode`` alone; it declines anything else
(unreadable, empty, undecodable, not 8-bit), which then decodes here with ``imread`` itself, on a thread, as does
every TIFF and Pillow-only file, and every job of a worker that died. So the bytes are ``imread``'s.

Starting a worker takes about 0.15 s (Python, numpy, OpenCV), a third of a 256-image pass at 600 img/s, so the
workers are one pool per process, kept between loaders, as PyTorch's ``persistent_workers``: each loader has its
own :class:`DecoderProcesses` (and its own fallback threads, joined when it closes) on the shared pool, which stops
with ``yolo_fastdetect.disable()`` (:func:`stop_shared_pool`) and at exit.
"""

from __future__ import annotations

import atexit
import mmap
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

_WORKER = Path(__file__).with_name("_decoder_worker.py")
_STOP_SECONDS = 2.0  # a worker that has not exited this long after its socket closed is killed
_SHUT_DOWN = "yolo_fastdetect: decoder processes shut down"

Reply = Callable[[np.ndarray | None], None]  # called with the image, or None: declined, or the worker died


def _mapped(fd: int, shape: tuple[int, ...]) -> np.ndarray:
    """The uint8 image of ``shape`` in the memfd ``fd`` (closed here; the array keeps the mapping alive)."""
    try:
        mapping = mmap.mmap(fd, int(np.prod(shape)))
    finally:
        os.close(fd)
    return np.frombuffer(mapping, np.uint8).reshape(shape)


class _Worker:
    """One decoder process, its socket, and the replies it owes (job number -> callback)."""

    def __init__(self):
        self.connection, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen([sys.executable, str(_WORKER), str(theirs.fileno())],
                                            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        self.jobs: dict[int, Reply] = {}
        self.alive = True

    def hang_up(self) -> None:
        """End the conversation: the worker reads EOF and exits, a reader blocked on the socket wakes up."""
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already shut down, or the worker is gone

    def stop(self) -> None:
        """Wait for the process to exit (kill it if it does not) and close the socket."""
        try:
            self.process.wait(_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.connection.close()


class _Pool:
    """``size`` workers and a reader thread each; :meth:`send` gives a job to the least busy living worker."""

    def __init__(self, size: int):
        self.size, self.owner = size, os.getpid()
        self._lock = threading.Lock()
        self._next_job = 0
        self._workers: list[_Worker] = []
        self._readers: list[threading.Thread] = []
        try:
            for index in range(size):
                self._workers.append(_Worker())
                reader = threading.Thread(target=self._read, args=(self._workers[-1],), daemon=True,
                                          name=f"yolo_fastdetect_pool_reader_{index}")
                self._readers.append(reader)
                reader.start()
        except BaseException:
            self.stop()
            raise

    @property
    def whole(self) -> bool:
        """Whether every worker lives."""
        return all(worker.alive for worker in self._workers)

    def send(self, path: str, flags: int, whole_jpeg: bool, reply: Reply) -> bool:
        """Have a worker decode ``path`` (``whole_jpeg``: only if it ends in its EOI marker); ``reply`` is called on a
        reader thread. False where no worker lives."""
        with self._lock:
            living = [w for w in self._workers if w.alive]
            if not living:
                return False
            worker = min(living, key=lambda w: len(w.jobs))
            job, self._next_job = self._next_job, self._next_job + 1
            worker.jobs[job] = reply
            try:
                worker.connection.send(pickle.dumps((job, path, flags, whole_jpeg)))
            except OSError:  # the worker died: its reader answers the job with None
                pass
        return True

    def _read(self, worker: _Worker) -> None:
        """A worker's answers, in order, to their callbacks; when it is gone, None to what it still owed."""
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(worker.connection, 1 << 16, 1)
            except OSError:
                message, fds = b"", []
            if not message:
                break
            job, shape = pickle.loads(message)
            with self._lock:
                reply = worker.jobs.pop(job)
            try:
                image = _mapped(fds[0], shape) if shape is not None and fds else None
            except (OSError, ValueError):  # not mappable: decoded on a thread instead
                image = None
            reply(image)
        with self._lock:
            worker.alive = False
            owed, worker.jobs = list(worker.jobs.values()), {}
        for reply in owed:
            reply(None)

    def stop(self) -> None:
        """Stop the workers and join the readers (what the workers owed is answered with None)."""
        for worker in self._workers:
            worker.hang_up()
        for reader in self._readers:
            reader.join()
        for worker in self._workers:
            worker.stop()


_shared: _Pool | None = None
_shared_lock = threading.Lock()


def _shared_pool(size: int) -> _Pool:
    """The process's pool of ``size`` workers (made anew where it has another size or a worker died; in a forked
    child, whose copy of the pool talks to its parent's workers, one of its own)."""
    global _shared
    with _shared_lock:
        if _shared is not None and _shared.owner != os.getpid():
            _shared = None  # the parent's: not ours to stop
        if _shared is None or _shared.size != size or not _shared.whole:
            if _shared is not None:
                _shared.stop()
            _shared = _Pool(size)
        return _shared


def stop_shared_pool() -> None:
    """Stop the shared pool's workers, if there are any (``yolo_fastdetect.disable()`` and exit call it)."""
    global _shared
    with _shared_lock:
        pool, _shared = _shared, None
    if pool is not None and pool.owner == os.getpid():
        pool.stop()


atexit.register(stop_shared_pool)


class DecoderProcesses(Executor):
    """An executor of ``decode(item)`` whose workers (the process's shared pool of ``processes``) decode the file
    ``request(item)`` names, where it names one: ``decode`` must give, for such an item, ``finish(item, image)`` of
    the image ``cv2.imdecode(np.fromfile(file), flags)`` gives, wherever that is an 8-bit image (and the file ends
    in its EOI marker, with ``whole_jpeg``). Other items, other functions, and the files a worker declines run on up
    to ``threads`` threads of this executor's own.

    Args:
        processes (int): Workers of the shared pool.
        decode (Callable): The in-process decode of one item, which the workers stand in for.
        request (Callable[[Any], str | None]): The file a worker may decode for an item, or None.
        flags (int): The ``cv2.IMREAD_*`` flags ``decode`` reads with.
        finish (Callable[[Any, np.ndarray], Any] | None): Applied here to each item and the image a worker decoded
            for it (what ``decode`` does after decoding: naming it, the upload-ahead), or None: the image itself.
        threads (int): Threads for what the workers do not decode (started only as needed).
        whole_jpeg (bool): Whether a worker declines a file that does not end in its EOI marker.

    Raises:
        OSError: The workers could not be started (no interpreter to run them).

    Examples:
        >>> with DecoderProcesses(4, decode, lambda path: path, cv2.IMREAD_COLOR) as pool:
        ...     image = pool.submit(decode, "bus.jpg").result()
    """

    def __init__(self, processes: int, decode: Callable, request: Callable[[Any], str | None], flags: int,
                 finish: Callable[[Any, np.ndarray], Any] | None = None, threads: int = 1, whole_jpeg: bool = False):
        self._decode, self._request, self._flags, self._finish = decode, request, flags, finish
        self._whole_jpeg = whole_jpeg
        self._pool = _shared_pool(max(1, processes))
        self._lock = threading.Lock()
        self._owed: set[Future] = set()  # futures a worker is to resolve
        self._closed = False
        self._threads = ThreadPoolExecutor(max(1, threads), thread_name_prefix="yolo_fastdetect_decode")

    def submit(self, fn: Callable, /, *args, **kwargs) -> Future:
        """``fn(*args, **kwargs)``, computed by a worker where ``fn`` is ``decode`` of an item that names a file."""
        path = self._request(args[0]) if fn is self._decode and len(args) == 1 and not kwargs else None
        if path is None:
            return self._threads.submit(fn, *args, **kwargs)
        future: Future = Future()
        future.set_running_or_notify_cancel()  # owed by a worker: not cancellable, resolved at shutdown at the latest
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._owed.add(future)
        item = args[0]
        if not self._pool.send(os.fspath(path), self._flags, self._whole_jpeg, partial(self._on_reply, future, item)):
            self._on_reply(future, item, None)
        return future

    def _on_reply(self, future: Future, item, image: np.ndarray | None) -> None:
        """A worker's answer for ``item``: the image finished here, or (None) ``decode(item)`` on a thread."""
        with self._lock:
            if future not in self._owed:  # shut down meanwhile: the future has its exception already
                return
            self._owed.discard(future)
        if image is None:
            self._on_thread(future, item)
            return
        try:
            future.set_result(self._finish(item, image) if self._finish is not None else image)
        except BaseException as error:  # noqa: BLE001 - the consumer's next() raises it
            future.set_exception(error)

    def _on_thread(self, future: Future, item) -> None:
        """Resolve ``future`` with ``decode(item)`` run on a thread (what the worker declined or still owed)."""
        def relay(done: Future) -> None:
            if done.cancelled():  # the executor shut down before the thread took it
                future.set_exception(RuntimeError(_SHUT_DOWN))
            elif done.exception() is not None:
                future.set_exception(done.exception())
            else:
                future.set_result(done.result())

        try:
            self._threads.submit(self._decode, item).add_done_callback(relay)
        except RuntimeError as error:  # shut down meanwhile
            future.set_exception(error)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Fail what the workers still owe this executor (they go on with the pool) and join its threads."""
        with self._lock:
            self._closed = True
            owed, self._owed = self._owed, set()
        for future in owed:
            future.set_exception(RuntimeError(_SHUT_DOWN))
        self._threads.shutdown(wait=wait, cancel_futures=cancel_futures)


def start_decoders(processes: int, *args, **kwargs) -> DecoderProcesses | None:
    """``DecoderProcesses(processes, *args, **kwargs)``, or None (the loader decodes on threads): for no processes,
    and, with a warning, where the workers cannot start."""
    if processes < 1:
        return None
    try:
        return DecoderProcesses(processes, *args, **kwargs)
    except OSError as error:
        from ultralytics.utils import LOGGER

        LOGGER.warning(f"yolo_fastdetect: decoder processes did not start ({error}); decoding on threads")
        return None
