"""Which video streams a decoder's planes, converted on the GPU, give ``cv2.VideoCapture``'s frames of
(:mod:`yolo_fastdetect.sources.converted_video`), on the CPU: real clips probed with PyAV (H.264 and HEVC, both
ranges, BT.709 and SMPTE 170M), what PyAV cannot read, and the one-line reason for each stream ruled out.
"""

from __future__ import annotations

import pytest

from video_corpus import write_camera_clip
from yolo_fastdetect.sources.converted_video import StreamTags, probe_stream, stream_reason

pytest.importorskip("av", reason="PyAV writes the H.264 / HEVC clips and reads their colour tags")

BT709_LIMITED = ("h264", 1280, 720, "yuv420p", 1, 1, 1, 1)


@pytest.mark.parametrize(("codec", "size", "full_range", "expected"), [
    ("h264", "96x64", False, ("h264", 96, 64, "yuv420p", 6, 1, 6, 6)),  # SMPTE 170M below 720 rows
    ("hevc", "160x90", False, ("hevc", 160, 90, "yuv420p", 6, 1, 6, 6)),
    ("h264", "98x720", True, ("h264", 98, 720, "yuvj420p", 1, 2, 1, 1)),  # BT.709 from 720 rows, full range
])
def test_probe_reads_the_first_frames_tags(tmp_path, codec, size, full_range, expected):
    path = write_camera_clip(tmp_path / f"clip_{codec}.mp4", 4, size, codec, full_range=full_range)
    tags = probe_stream(str(path))
    assert tags == StreamTags(*expected)
    assert stream_reason(tags) is None
    assert tags.conversion("4.13.0") == (expected[4], full_range)
    assert tags.conversion("4.12.0") == (2, full_range)  # OpenCV 4.12 converts every frame as BT.601


def test_probe_of_what_pyav_cannot_read_is_none(tmp_path):
    (tmp_path / "text.mp4").write_text("not a video\n" * 50)
    (tmp_path / "empty.mp4").write_bytes(b"")
    assert probe_stream(str(tmp_path / "text.mp4")) is None
    assert probe_stream(str(tmp_path / "empty.mp4")) is None
    assert probe_stream(str(tmp_path / "missing.mp4")) is None


@pytest.mark.parametrize(("changes", "words"), [
    ({"codec": "mpeg4"}, "codec mpeg4 is not H.264 or HEVC"),
    ({"codec": "vp9"}, "codec vp9 is not H.264 or HEVC"),
    ({"pixel_format": "yuv420p10le"}, "pixel format yuv420p10le is not 8-bit 4:2:0"),
    ({"pixel_format": "yuvj422p"}, "pixel format yuvj422p is not 8-bit 4:2:0"),
    ({"height": 479}, "odd height 479"),
    ({"colorspace": 9, "color_primaries": 9, "color_trc": 16}, "matrix 9, primaries 9, transfer 16"),  # HDR10
    ({"colorspace": 8}, "matrix 8"),  # YCgCo: no swscale coefficients
])
def test_each_reason_is_one_line_naming_the_value(changes, words):
    tags = StreamTags(*BT709_LIMITED)
    assert stream_reason(tags, "5.1.0") is None
    reason = stream_reason(StreamTags(**{**tags.__dict__, **changes}), "5.1.0")
    assert reason is not None and words in reason and "\n" not in reason


def test_tags_opencv_412_converts_as_bt601_are_no_reason():
    hdr = StreamTags("hevc", 3840, 2160, "yuv420p", 9, 1, 9, 16)
    assert stream_reason(hdr, "4.12.0") is None  # 4.12 ignores the tags: its plain BT.601 conversion
    assert "OpenCV 4.13.0" in stream_reason(hdr, "4.13.0")
