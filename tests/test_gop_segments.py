"""One video's closed GOPs on several decoders (:mod:`yolo_fastdetect.sources.gop_segments`), on the CPU.

Where segments start: real H.264 and HEVC streams from x264 / x265 (closed GOPs, and x265's open GOPs whose CRA key
frames are no boundary), and hand-made packets. The ordering: random segment sizes and worker timings (seeded),
every item handed out once in segment order, a producer's error raised after the items it made, a consumer
that stops early, and a producer that breaks the order.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from yolo_fastdetect.sources.gop_segments import InOrderSegments, SegmentOrderError, starts_with_idr

av = pytest.importorskip("av", reason="PyAV encodes the H.264 / HEVC streams")


def annex_b_packets(tmp_path, codec: str, options: dict[str, str], frames: int = 35) -> list[tuple[bool, bytes]]:
    """(demuxer's key flag, bytes) of each packet of a raw (Annex B) ``codec`` stream of 160x96 camera frames."""
    from yolo_fastdetect.bench._camera_clips import camera_frames

    path = tmp_path / f"clip.{codec}"
    with av.open(str(path), "w", format=codec) as container:
        stream = container.add_stream("libx264" if codec == "h264" else "libx265", rate=30, options=options)
        stream.width, stream.height, stream.pix_fmt = 160, 96, "yuv420p"
        for index, image in enumerate(camera_frames(frames, 160, 96)):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(path)) as container:
        return [(packet.is_keyframe, bytes(packet)) for packet in container.demux(container.streams.video[0])
                if packet.size]


@pytest.mark.parametrize(("codec", "options"), [
    ("h264", {"preset": "veryfast", "g": "10", "keyint_min": "10", "sc_threshold": "0"}),
    ("hevc", {"preset": "veryfast", "x265-params": "log-level=error:keyint=10:min-keyint=10:open-gop=0"}),
])
def test_closed_gops_start_at_every_key_frame(tmp_path, codec, options):
    packets = annex_b_packets(tmp_path, codec, options)
    assert len(packets) == 35
    assert [index for index, (key, data) in enumerate(packets) if starts_with_idr(data, codec == "hevc")] == \
        [index for index, (key, data) in enumerate(packets) if key] == [0, 10, 20, 30]


def test_open_gops_key_frames_are_no_boundary(tmp_path):
    """x265's default GOPs are open: its later key frames are CRA pictures, which refer back; only the first is IDR."""
    packets = annex_b_packets(tmp_path, "hevc", {"preset": "veryfast", "x265-params": "log-level=error:keyint=10"})
    keys = [index for index, (key, data) in enumerate(packets) if key]
    assert len(keys) > 1
    assert [index for index, (key, data) in enumerate(packets) if starts_with_idr(data, hevc=True)] == [0]


@pytest.mark.parametrize(("data", "hevc", "expected"), [
    (b"\x00\x00\x00\x01\x09\xf0\x00\x00\x01\x06\x05\x00\x00\x01\x65\x88", False, True),  # AUD, SEI, IDR slice
    (b"\x00\x00\x01\x41\x9a", False, False),  # a P slice
    (b"\x00\x00\x01\x06\x05\x01", False, False),  # no slice in it
    (b"\x00\x00\x01", False, False),  # a start code at the very end
    (b"\x65\x88\x84", False, False),  # no start code (length-prefixed, as in MP4)
    (b"", True, False),
    (b"\x00\x00\x01\x40\x01\x00\x00\x01\x26\x01\xaf", True, True),  # VPS, IDR_W_RADL slice
    (b"\x00\x00\x01\x28\x01\xaf", True, True),  # IDR_N_LP
    (b"\x00\x00\x01\x2a\x01\xaf", True, False),  # CRA
    (b"\x00\x00\x01\x02\x01\xd0", True, False),  # TRAIL_R
])
def test_starts_with_idr_reads_the_first_picture(data, hevc, expected):
    assert starts_with_idr(data, hevc) is expected


def random_segments(generator: torch.Generator) -> list[int]:
    count = int(torch.randint(0, 12, (1,), generator=generator))
    return torch.randint(0, 7, (count,), generator=generator).tolist()  # some segments give no item


def producer(sizes: list[int], workers: int, delays: torch.Tensor, fail_at: int | None = None):
    """Items (segment, index) of each segment, emitted after random short sleeps; raises at segment ``fail_at``."""
    def produce(worker, emit):
        for segment in range(worker, len(sizes), workers):
            if segment == fail_at:
                raise RuntimeError(f"decoder error in segment {segment}")
            for index in range(sizes[segment]):
                time.sleep(float(delays[segment, index]))
                if not emit(segment, (segment, index)):
                    return None
        return len(sizes)
    return produce


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
@pytest.mark.parametrize("ahead", [1, 3])
def test_items_come_in_segment_order(generator, workers, ahead):
    for _ in range(4):
        sizes = random_segments(generator)
        delays = torch.rand((max(1, len(sizes)), 7), generator=generator) * 2e-3
        items = list(InOrderSegments(workers, producer(sizes, workers, delays), ahead))
        assert items == [(segment, index) for segment, size in enumerate(sizes) for index in range(size)]


def test_a_producer_error_is_raised_after_its_earlier_items(generator):
    sizes = [3, 2, 4, 1, 2]
    delays = torch.rand((5, 7), generator=generator) * 1e-3
    items = []
    with pytest.raises(RuntimeError, match="decoder error in segment 3"):
        for item in InOrderSegments(2, producer(sizes, 2, delays, fail_at=3), ahead=2):
            items.append(item)
    assert items == [(segment, index) for segment in range(2) for index in range(sizes[segment])]  # worker 1's


def test_a_consumer_that_stops_early_ends_every_worker(generator):
    sizes = [50] * 8
    delays = torch.zeros((8, 50))
    segments = InOrderSegments(4, producer(sizes, 4, delays), ahead=2, name="early_stop")
    items = iter(segments)
    taken = [next(items) for _ in range(7)]
    assert taken == [(0, index) for index in range(7)]
    assert len([thread for thread in threading.enumerate() if thread.name.startswith("early_stop")]) == 4
    segments.close()
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("early_stop")]


@pytest.mark.parametrize(("emitted", "message"), [
    ([(0, "a"), (2, "b"), (0, "c")], "segment 0 came after that segment was complete"),
    ([(1, "a")], "from worker 0 of 2"),  # another worker's segment
])
def test_a_producer_breaking_the_order_is_an_error(emitted, message):
    def produce(worker, emit):
        for segment, item in emitted if worker == 0 else []:
            emit(segment, item)
        return 4
    with pytest.raises(SegmentOrderError, match=message):
        list(InOrderSegments(2, produce, ahead=4))


@pytest.mark.parametrize(("workers", "ahead"), [(0, 1), (1, 0)])
def test_workers_and_ahead_must_be_positive(workers, ahead):
    with pytest.raises(ValueError, match="workers .* and ahead .* must be at least 1"):
        InOrderSegments(workers, lambda worker, emit: 0, ahead)
