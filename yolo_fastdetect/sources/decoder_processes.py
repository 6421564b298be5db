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
every TIFF and Pillow-only file, and every job of a worker that died. So the bytes are ``imread``'s. The workers
start with the executor (about 0.15 s) and stop at its ``shutdown``.
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

_WORKER = Path(__file__).with_name("_decoder_worker.py")
_STOP_SECONDS = 2.0  # a worker that has not exited this long after its socket closed is killed


def _mapped(fd: int, shape: tuple[int, ...]) -> np.ndarray:
    """The uint8 image of ``shape`` in the memfd ``fd`` (closed here; the array keeps the mapping alive)."""
    try:
        mapping = mmap.mmap(fd, int(np.prod(shape)))
    finally:
        os.close(fd)
    return np.frombuffer(mapping, np.uint8).reshape(shape)


class _Worker:
    """One decoder process, its socket, and the jobs it owes (job number -> future and item)."""

    def __init__(self):
        self.connection, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen([sys.executable, str(_WORKER), str(theirs.fileno())],
                                            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        self.jobs: dict[int, tuple[Future, Any]] = {}
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


class DecoderProcesses(Executor):
    """An executor of ``decode(item)`` whose workers decode the file ``request(item)`` names, where it names one:
    ``decode`` must give, for such an item, the image ``imread(file, flags)`` gives, passed through ``finish``.
    Other items, other functions, and the files a worker declines run on up to ``threads`` threads.

    Args:
        processes (int): Worker processes.
        decode (Callable): The in-process decode of one item, which the workers stand in for.
        request (Callable[[Any], str | None]): The file a worker may decode for an item (one that Ultralytics'
            ``imread`` decodes with ``cv2.imdecode`` alone: not a TIFF nor a Pillow-only suffix), or None.
        flags (int): The ``cv2.IMREAD_*`` flags ``decode`` reads with.
        finish (Callable[[np.ndarray], Any] | None): Applied here to each image a worker decodes (what ``decode``
            does after ``imread``, such as the upload-ahead), or None.
        threads (int): Threads for what the workers do not decode (started only as needed).

    Examples:
        >>> with DecoderProcesses(4, decode, lambda path: path, cv2.IMREAD_COLOR) as pool:
        ...     image = pool.submit(decode, "bus.jpg").result()
    """

    def __init__(self, processes: int, decode: Callable, request: Callable[[Any], str | None], flags: int,
                 finish: Callable[[np.ndarray], Any] | None = None, threads: int = 1):
        self._decode, self._request, self._flags, self._finish = decode, request, flags, finish
        self._lock = threading.Lock()
        self._next_job = 0
        self._closed = False
        self._threads = ThreadPoolExecutor(max(1, threads), thread_name_prefix="yolo_fastdetect_decode")
        self._workers: list[_Worker] = []
        self._readers: list[threading.Thread] = []
        try:
            for index in range(max(1, processes)):
                self._workers.append(_Worker())
                reader = threading.Thread(target=self._read, args=(self._workers[-1],), daemon=True,
                                          name=f"yolo_fastdetect_decode_reader_{index}")
                self._readers.append(reader)
                reader.start()
        except BaseException:
            self.shutdown()
            raise

    @property
    def decode(self) -> Callable:
        """The function whose items the workers decode: submit it."""
        return self._decode

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
            living = [w for w in self._workers if w.alive]
            if not living:
                return self._threads.submit(fn, *args)
            worker = min(living, key=lambda w: len(w.jobs))
            job, self._next_job = self._next_job, self._next_job + 1
            worker.jobs[job] = (future, args[0])
            try:
                worker.connection.send(pickle.dumps((job, os.fspath(path), self._flags)))
            except OSError:  # the worker died: its reader hands its jobs to threads
                pass
        return future

    def _read(self, worker: _Worker) -> None:
        """A worker's answers, in order: resolve each job's future; decline and a dead worker go to threads."""
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(worker.connection, 1 << 16, 1)
            except OSError:
                message, fds = b"", []
            if not message:
                break
            job, shape = pickle.loads(message)
            with self._lock:
                future, item = worker.jobs.pop(job)
            if shape is None or not fds:
                self._on_thread(future, item)
                continue
            try:
                image = _mapped(fds[0], shape)
                future.set_result(self._finish(image) if self._finish is not None else image)
            except BaseException as error:  # noqa: BLE001 - the consumer's next() raises it
                future.set_exception(error)
        with self._lock:
            worker.alive = False
            owed, worker.jobs = list(worker.jobs.values()), {}
            closed = self._closed
        for future, item in owed:
            if closed:
                future.set_exception(RuntimeError("yolo_fastdetect: decoder processes shut down"))
            else:
                self._on_thread(future, item)

    def _on_thread(self, future: Future, item) -> None:
        """Resolve ``future`` with ``decode(item)`` run on a thread (what the worker declined or still owed)."""
        def relay(done: Future) -> None:
            if done.cancelled():  # the executor shut down before the thread took it
                future.set_exception(RuntimeError("yolo_fastdetect: decoder processes shut down"))
            elif done.exception() is not None:
                future.set_exception(done.exception())
            else:
                future.set_result(done.result())

        try:
            self._threads.submit(self._decode, item).add_done_callback(relay)
        except RuntimeError as error:  # shut down meanwhile
            future.set_exception(error)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the workers (their jobs fail), join the reader threads and the fallback threads."""
        with self._lock:
            self._closed = True
        for worker in self._workers:
            worker.hang_up()
        for reader in self._readers:
            reader.join()
        for worker in self._workers:
            worker.stop()
        self._threads.shutdown(wait=wait, cancel_futures=cancel_futures)
