"""One video decoded by several decoders at once: each takes whole closed GOPs, the frames come out in stream order.

One NVDEC decoder delivers about one frame at a time (docs/video_design.md), so one stream's rate is bounded by one
decoder however many the GPU has. An IDR picture starts a closed group of pictures: no picture from it on refers to
one before it, and every picture before it is output before any picture from it on. The packets from one IDR to the
next (a *segment*) therefore decode to the same frames on a fresh decoder as on the one that decoded the stream from
the start. Segment ``s`` goes to decoder ``s % decoders``; :class:`InOrderSegments` hands the frames out by segment.

The segment boundaries are read from the packets themselves (:func:`starts_with_idr`): a packet the demuxer marks as
a key frame whose first picture is an IDR. A key frame that is not an IDR (an open GOP's I picture, an HEVC CRA) is
no boundary, so a stream without IDRs after its first packet is one segment, decoded by one decoder.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from .handoff import POLL_S, drain, get_from, put_unless_stopped

__all__ = ["InOrderSegments", "SegmentOrderError", "starts_with_idr"]

# NAL unit types (H.264: the low 5 bits of the header byte; HEVC: bits 1-6). VCL units carry a picture's slices.
_H264_VCL, _H264_IDR = range(1, 6), 5
_HEVC_VCL_END, _HEVC_IDR = 32, (19, 20)  # IDR_W_RADL, IDR_N_LP


class SegmentOrderError(RuntimeError):
    """A decoder gave a frame that does not belong where the segments say (its segment done, or none of its own)."""


def starts_with_idr(access_unit: bytes, hevc: bool) -> bool:
    """Whether the first picture (VCL NAL unit) of an Annex B ``access_unit`` is an IDR picture.

    Args:
        access_unit (bytes): One packet of an H.264 or HEVC elementary stream with start codes (``00 00 01``), as
            NVDEC takes it. Only the units before the first picture's are read: its start is enough.
        hevc (bool): HEVC NAL unit headers, not H.264's.

    Returns:
        (bool): True where the packet's first picture is IDR; False where it is not, or no picture starts in it.

    Examples:
        >>> starts_with_idr(b"\\x00\\x00\\x01\\x67\\x64\\x00\\x00\\x01\\x65\\x88", hevc=False)  # SPS, IDR slice
        True
        >>> starts_with_idr(b"\\x00\\x00\\x01\\x41\\x9a", hevc=False)  # a P slice
        False
    """
    start = 0
    while True:
        start = access_unit.find(b"\x00\x00\x01", start)
        if start < 0 or start + 3 >= len(access_unit):
            return False
        header = access_unit[start + 3]
        start += 3
        if hevc:
            unit_type = (header >> 1) & 0x3F
            if unit_type < _HEVC_VCL_END:
                return unit_type in _HEVC_IDR
        else:
            unit_type = header & 0x1F
            if unit_type in _H264_VCL:
                return unit_type == _H264_IDR


_END = "segment end"  # a worker's segment is complete
_DONE = "done"  # a worker has no further segment


class InOrderSegments:
    """The items of segments 0, 1, 2, ..., made by ``workers`` threads at once (segment ``s`` by thread ``s %
    workers``), handed out in segment order and, within one, in the order made.

    ``produce(worker, emit)`` runs on worker thread ``worker``: it makes the items of that worker's segments in
    increasing segment order, calls ``emit(segment, item)`` for each, and returns the number of segments of the
    stream (every worker finds them all). A worker's segment is complete once it emits an item of a later segment
    or returns, so a segment may give no item; an item of a segment already complete, or of another worker's, raises
    :class:`SegmentOrderError`. ``emit`` returns False once the consumer has stopped (the producer should return). A
    worker holds at most ``ahead`` items not yet handed out; the consumer always drains the worker of the segment it
    is on, so no worker waits for ever. What ``produce`` raises is raised by the iteration once the items that worker
    emitted before it are handed out: what came out is then a prefix of the stream's items.

    Args:
        workers (int): Threads, at least 1.
        produce (Callable): ``produce(worker: int, emit: Callable[[int, object], bool]) -> int | None``.
        ahead (int): Items each worker makes ahead of the consumer, at least 1.
        name (str): The threads' name.

    Examples:
        >>> def produce(worker, emit):  # segment s holds (s, 0), (s, 1), (s, 2)
        ...     for segment in range(worker, 5, 2):
        ...         for index in range(3):
        ...             emit(segment, (segment, index))
        ...     return 5
        >>> items = list(InOrderSegments(2, produce, ahead=2))
        >>> items[:4]
        [(0, 0), (0, 1), (0, 2), (1, 0)]
    """

    def __init__(self, workers: int, produce: Callable[[int, Callable[[int, object], bool]], int | None], ahead: int,
                 name: str = "yolo_fastdetect_segments"):
        if workers < 1 or ahead < 1:
            raise ValueError(f"InOrderSegments: workers ({workers}) and ahead ({ahead}) must be at least 1")
        self._stop = threading.Event()
        self._queues = [queue.Queue(maxsize=ahead) for _ in range(workers)]
        self._threads = [threading.Thread(target=self._work, args=(worker, produce), daemon=True,
                                          name=f"{name}_{worker}") for worker in range(workers)]
        for thread in self._threads:
            thread.start()

    def _put(self, worker: int, item) -> bool:
        return put_unless_stopped(self._queues[worker], self._stop, item)

    def _work(self, worker: int, produce: Callable) -> None:
        workers = len(self._queues)
        open_segment = worker  # this worker's first segment not marked complete

        def complete_before(segment: int) -> bool:
            """Mark this worker's segments before ``segment`` complete."""
            nonlocal open_segment
            while open_segment < segment:
                if not self._put(worker, (open_segment, _END)):
                    return False
                open_segment += workers
            return True

        def emit(segment: int, item) -> bool:
            if segment < open_segment or segment % workers != worker:
                raise SegmentOrderError(f"an item of segment {segment} came after that segment was complete, or "
                                        f"from worker {worker} of {workers}")
            return complete_before(segment) and self._put(worker, (segment, item))

        try:
            segments = produce(worker, emit)
            if segments is not None and complete_before(segments):
                self._put(worker, (None, _DONE))
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, which raises it
            self._put(worker, (None, error))

    def _get(self, worker: int):
        return get_from(self._queues[worker], self._threads[worker],
                        "yolo_fastdetect: a segment decoder stopped without a word")

    def __iter__(self) -> Iterator:
        segment = 0
        try:
            while True:
                worker = segment % len(self._queues)
                got, item = self._get(worker)
                if item is _DONE:
                    return  # the worker of this segment has none: the stream has `segment` segments
                if isinstance(item, BaseException):
                    raise item
                if got != segment:  # (a worker emits its segments in order, each after the ones before it)
                    raise SegmentOrderError(f"worker {worker} gave segment {got} where segment {segment} was due")
                if item is _END:
                    segment += 1
                else:
                    yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the workers and join them; drops the items not handed out (idempotent)."""
        self._stop.set()
        for thread, items in zip(self._threads, self._queues):
            while thread.is_alive():  # (a worker blocked on a full queue sees the stop within POLL_S anyway)
                thread.join(POLL_S)
                drain(items)
            drain(items)
