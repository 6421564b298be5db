"""Decoded video frames to BGR as ``cv2.VideoCapture`` gives them (``yolo_fastdetect.ops.video_color``): the operator
and the numpy reference against cv2's frames of H.264, HEVC and MPEG-4 clips (sizes that are not multiples of 16, an
odd width, BT.601 / BT.709 / BT.2020 / FCC / SMPTE 240M tags, limited and full range, a variable frame rate); the
streams cv2 converts otherwise (odd heights, wide gamuts, HDR transfers) or not at all, and OpenCV's versions
(``opencv_conversion``); the operator against the reference on random pitched NV12 and I420 planes; bad arguments;
the schema; CUDA == CPU."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import video_corpus
from conftest import devices
from video_corpus import opencv_frames, write_camera_clip, write_clip, write_opencv
from yolo_fastdetect import _ext
from yolo_fastdetect.ops import (
    i420_to_bgr,
    nv12_to_bgr,
    opencv_conversion,
    swscale_coefficients,
    yuv420_to_bgr_reference,
)
from yolo_fastdetect.ops.video_color import _version

pytestmark = pytest.mark.skipif(not _ext.available(), reason="operators not built")
needs_av = pytest.mark.skipif(video_corpus.av is None, reason="needs PyAV (av) to write and decode clips")
needs_tagged_opencv = pytest.mark.skipif(_version(cv2.__version__) < (4, 13),
                                         reason="OpenCV before 4.13 converts every frame as BT.601")

CONVERTED_MATRICES = [0, 1, 2, 4, 5, 6, 7, 9]  # the AVColorSpace values OpenCV's reader converts


def decoded_frames(path: Path) -> list[tuple[list[np.ndarray], dict]]:
    """Each frame of the clip as FFmpeg's software decoder gives it (through PyAV): its Y, U and V planes and its
    properties, as :func:`opencv_conversion` takes them."""
    frames = []
    with video_corpus.av.open(str(path)) as container:
        for frame in container.decode(video=0):
            planes = [np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)[:, : plane.width].copy()
                      for plane in frame.planes]
            properties = {"height": frame.height, "colorspace": int(frame.colorspace),
                          "color_range": int(frame.color_range), "color_primaries": int(frame.color_primaries),
                          "color_trc": int(frame.color_trc), "pixel_format": frame.format.name}
            frames.append((planes, properties))
    return frames


def converted(planes: list[np.ndarray], colorspace: int, full_range: bool, device: str = "cpu",
              layout: str = "i420") -> np.ndarray:
    """The operator's BGR frame of numpy planes on ``device``: as three planes, or with U and V interleaved (NV12)."""
    luma, chroma_u, chroma_v = (torch.from_numpy(plane).to(device) for plane in planes)
    if layout == "nv12":
        return nv12_to_bgr(luma, torch.stack((chroma_u, chroma_v), -1), colorspace, full_range).cpu().numpy()
    return i420_to_bgr(luma, chroma_u, chroma_v, colorspace, full_range).cpu().numpy()


def assert_matches_opencv(path: Path, device: str = "cpu", layout: str = "i420") -> None:
    """Frame for frame, the operator (and on the CPU the reference) with :func:`opencv_conversion`'s parameters for
    the installed OpenCV equals cv2's frame bit for bit."""
    decoded, expected = decoded_frames(path), opencv_frames(path)
    assert len(decoded) == len(expected) > 0
    for index, ((planes, properties), frame) in enumerate(zip(decoded, expected)):
        parameters = opencv_conversion(**properties)
        assert parameters is not None, f"frame {index}: {properties}"
        ours = converted(planes, *parameters, device, layout)
        assert ours.shape == frame.shape and ours.flags.c_contiguous
        assert np.array_equal(ours, frame), f"frame {index}: {np.count_nonzero(ours != frame)} values differ"
        if device == "cpu":
            assert np.array_equal(yuv420_to_bgr_reference(*planes, *parameters), frame), f"frame {index}"


# Each writes a short clip to the path it is given; sizes that are not multiples of 16 (and one odd width) run the
# SIMD converter's row tails.
CLIPS = {
    "h264_1366x768_bt709": lambda path: write_camera_clip(path, 3, "1366x768"),
    "hevc_854x480_bt601": lambda path: write_camera_clip(path, 4, "480p", "hevc"),
    "h264_170x96_full_range": lambda path: write_camera_clip(path, 4, (170, 96), full_range=True),
    "hevc_98x74": lambda path: write_camera_clip(path, 4, (98, 74), "hevc"),
    "h264_vfr_160x90": lambda path: write_camera_clip(path, 5, (160, 90), frame_times=[0, 0.01, 0.1, 0.13, 0.4]),
    "mpeg4_odd_width_65x50": lambda path: write_clip(path, video_corpus.camera_frames(3, 65, 50), 65, 50, "mpeg4"),
    "mp4v_opencv_writer": lambda path: write_opencv(path, 4, 160, 120),
}


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("video_color")


@needs_av
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("name", list(CLIPS))
def test_matches_opencv_on_clips(clip_folder, name, device):
    path = clip_folder / f"{name}.mp4"
    if not path.exists():  # written once for both devices
        CLIPS[name](path)
    assert_matches_opencv(path, device)
    if name.startswith("h264_1366"):
        assert_matches_opencv(path, device, layout="nv12")


@needs_av
def test_camera_clip_command(tmp_path):
    """``python tests/video_corpus.py``: one clip per size and codec; with --vfr, irregular frame times."""
    video_corpus.main([str(tmp_path), "--sizes", "64x36", "--codecs", "h264,hevc", "--frames", "4", "--vfr"])
    for codec in ("h264", "hevc"):
        with video_corpus.av.open(str(tmp_path / f"camera_vfr_64x36_{codec}.mp4")) as container:
            times = [float(frame.time) for frame in container.decode(video=0)]
        intervals = np.diff(times)
        assert len(times) == 4 and (intervals > 0).all() and intervals.max() - intervals.min() > 0.005


def random_images(generator: torch.Generator, count: int, height: int, width: int) -> list[np.ndarray]:
    """Noise images: after encoding, every code value of every plane is likely to occur."""
    return list(torch.randint(0, 256, (count, height, width, 3), generator=generator, dtype=torch.uint8).numpy())


@needs_av
@pytest.mark.parametrize(
    "colorspace, full_range",
    [(1, False), (1, True), (5, False), (6, True), (9, False), (9, True), (4, False), (7, False), (0, False),
     (2, True)],
)
def test_matches_opencv_per_colour_tag(tmp_path, generator, colorspace, full_range):
    """Every matrix cv2 converts, in both ranges."""
    path = write_clip(tmp_path / "tagged.mp4", random_images(generator, 2, 48, 96), 96, 48, colorspace=colorspace,
                      full_range=full_range)
    tags = [(p["colorspace"], p["color_range"], p["pixel_format"]) for _, p in decoded_frames(path)]
    assert tags == [(colorspace, 2, "yuvj420p") if full_range else (colorspace, 1, "yuv420p")] * 2
    assert_matches_opencv(path)


@needs_av
@needs_tagged_opencv
@pytest.mark.parametrize(
    "primaries, transfer, exact",
    # cv2's colour-managed conversion takes seconds to set up (swscale builds a 3-D table): slow, one wide gamut and
    # one HDR transfer.
    [(1, 13, True), (6, 8, True), (5, 5, True), pytest.param(9, 1, False, marks=pytest.mark.slow),
     pytest.param(1, 16, False, marks=pytest.mark.slow)],
)
def test_primaries_and_transfer(tmp_path, generator, primaries, transfer, exact):
    """cv2 converts with the plain matrix under BT.709-like primaries and SDR transfers, and gamut- or tone-maps under
    wide gamuts (BT.2020, P3) and PQ / HLG: where :func:`opencv_conversion` says so."""
    path = write_clip(tmp_path / "tagged.mp4", random_images(generator, 1, 32, 64), 64, 32, colorspace=1,
                      primaries=primaries, transfer=transfer)
    ((planes, properties),), (frame,) = decoded_frames(path), opencv_frames(path)
    assert (properties["color_primaries"], properties["color_trc"]) == (primaries, transfer)
    assert (opencv_conversion(**properties) == (1, False)) is exact
    assert np.array_equal(converted(planes, 1, False), frame) is exact


@needs_av
def test_odd_height_is_converted_otherwise(tmp_path):
    """An odd height sends swscale down its scaling path (chroma interpolated vertically, bicubic): not exact, and
    said so."""
    path = write_clip(tmp_path / "odd.mp4", video_corpus.camera_frames(2, 64, 49), 64, 49, "mpeg4")
    ((planes, properties), _), (frame, _) = decoded_frames(path), opencv_frames(path)
    assert planes[0].shape == (49, 64) and opencv_conversion(**properties) is None
    assert not np.array_equal(converted(planes, 2, False), frame)


@needs_av
@needs_tagged_opencv
@pytest.mark.parametrize("colorspace", [8, 10, 12])
def test_matrices_opencv_cannot_convert(tmp_path, generator, colorspace):
    """YCgCo, BT.2020 constant luminance and later matrices: cv2 reads no frame (5.1) or one unlike any conversion
    of it (4.13 to 5.0), and ours refuse the tag."""
    path = write_clip(tmp_path / "tagged.mp4", random_images(generator, 1, 32, 64), 64, 32, colorspace=colorspace)
    ((planes, properties),), frames = decoded_frames(path), opencv_frames(path)
    assert properties["colorspace"] == colorspace and opencv_conversion(**properties) is None
    assert frames == [] or not any(np.array_equal(frames[0], converted(planes, matrix, False))
                                   for matrix in CONVERTED_MATRICES)
    with pytest.raises(ValueError, match="colorspace"):
        converted(planes, colorspace, False)


def test_opencv_versions():
    """Up to 4.12 OpenCV ignores the tags (BT.601, the range of the pixel format); from 4.13 on it follows them."""
    hdr = {"colorspace": 9, "color_range": 1, "color_primaries": 9, "color_trc": 16}
    for version in ("4.6.0", "4.12.0"):
        assert opencv_conversion(1080, **hdr, opencv_version=version) == (2, False)
        assert opencv_conversion(720, 1, 2, pixel_format="yuvj420p", opencv_version=version) == (2, True)
        assert opencv_conversion(720, 1, 2, opencv_version=version) == (2, False)  # range tag, not yuvj: limited
        assert opencv_conversion(721, opencv_version=version) is None
    for version in ("4.13.0", "4.14.0-pre", "5.1.0"):
        assert opencv_conversion(1080, **hdr, opencv_version=version) is None
        assert opencv_conversion(1080, 9, 1, 1, 1, opencv_version=version) == (9, False)
        assert opencv_conversion(720, 1, 2, pixel_format="yuvj420p", opencv_version=version) == (1, True)
        assert opencv_conversion(720, 1, 2, opencv_version=version) == (1, True)
        assert opencv_conversion(720, 10, opencv_version=version) is None
        assert opencv_conversion(721, opencv_version=version) is None
    assert opencv_conversion(720, pixel_format="yuv422p", opencv_version="5.1.0") is None


def random_planes(generator: torch.Generator, height: int, width: int, pitch: int = 0) -> tuple[torch.Tensor, ...]:
    """Random Y, U and V planes as views into buffers ``pitch`` bytes wider than their rows (a decoder's surface)."""
    chroma_height, chroma_width = (height + 1) // 2, (width + 1) // 2
    luma = torch.randint(0, 256, (height, width + pitch), generator=generator, dtype=torch.uint8)[:, :width]
    chroma = torch.randint(0, 256, (2, chroma_height, chroma_width + pitch), generator=generator, dtype=torch.uint8)
    return luma, chroma[0, :, :chroma_width], chroma[1, :, :chroma_width]


@pytest.mark.parametrize("height, width, pitch", [(1, 1, 0), (2, 3, 5), (5, 7, 0), (48, 64, 64), (37, 130, 3),
                                                  (120, 171, 0)])
def test_matches_reference_on_random_planes(generator, height, width, pitch):
    """Every code value of every plane, each matrix and range, strided planes, I420 and NV12 layouts."""
    luma, chroma_u, chroma_v = random_planes(generator, height, width, pitch)
    interleaved = torch.zeros(chroma_u.shape[0], 2 * chroma_u.shape[1] + pitch, dtype=torch.uint8)
    interleaved[:, 0 : 2 * chroma_u.shape[1] : 2], interleaved[:, 1 : 2 * chroma_u.shape[1] : 2] = chroma_u, chroma_v
    for colorspace in CONVERTED_MATRICES:
        for full_range in (False, True):
            expected = yuv420_to_bgr_reference(luma.numpy(), chroma_u.numpy(), chroma_v.numpy(), colorspace,
                                               full_range)
            assert np.array_equal(i420_to_bgr(luma, chroma_u, chroma_v, colorspace, full_range).numpy(), expected)
            nv12 = nv12_to_bgr(luma, interleaved[:, : 2 * chroma_u.shape[1]], colorspace, full_range)
            assert np.array_equal(nv12.numpy(), expected)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("frames, height, width, pitch", [(1, 5, 7, 0), (3, 37, 130, 3), (4, 48, 64, 64), (2, 1, 1, 0)])
def test_a_batch_of_frames_converts_as_each_frame_alone(generator, device, frames, height, width, pitch):
    """N frames in one call (an NVDEC fetch: each surface pitched, the UV plane after its luma, stacked) give the
    frames one call each gives."""
    chroma_height, chroma_width = (height + 1) // 2, (width + 1) // 2
    shape = (frames, height + chroma_height, 2 * chroma_width + pitch + 1)  # a column more: rows start off-grid
    surfaces = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8).to(device)[..., 1:]
    luma, chroma = surfaces[:, :height, :width], surfaces[:, height:, : 2 * chroma_width]
    for colorspace, full_range in ((1, False), (6, True)):
        batch = nv12_to_bgr(luma, chroma, colorspace, full_range)
        assert batch.shape == (frames, height, width, 3) and batch.is_contiguous() and batch.device == luma.device
        for index in range(frames):
            assert torch.equal(batch[index], nv12_to_bgr(luma[index], chroma[index], colorspace, full_range)), index
        planar = i420_to_bgr(luma, chroma[..., 0::2], chroma[..., 1::2], colorspace, full_range)
        assert torch.equal(planar, batch)
    expected = yuv420_to_bgr_reference(luma[-1].cpu().numpy(), chroma[-1, :, 0::2].cpu().numpy(),
                                       chroma[-1, :, 1::2].cpu().numpy(), 6, True)
    assert np.array_equal(batch[-1].cpu().numpy(), expected)


def test_known_values():
    """BT.601 limited-range black, white and saturated primaries, worked by hand from swscale's constants. Red
    (Y, U, V) = (81, 90, 240): y' = ((8 * 81 - 128) * 9539) >> 16 = 75, v = 8 * 240 - 1024 = 896,
    R = 75 + (896 * 13075) >> 16 = 75 + 178 = 253; u = 8 * 90 - 1024 = -304, B = 75 + (-304 * 16525) >> 16 = 75 - 77,
    clamped to 0: the floored products leave pure red at 253, as cv2 gives it."""
    samples = {(16, 128, 128): (0, 0, 0), (235, 128, 128): (255, 255, 255), (81, 90, 240): (0, 0, 253),
               (145, 54, 34): (0, 254, 0), (41, 240, 110): (254, 0, 0)}
    for (y, u, v), bgr in samples.items():
        planes = [torch.tensor([[sample]], dtype=torch.uint8) for sample in (y, u, v)]
        assert i420_to_bgr(*planes, colorspace=6)[0, 0].tolist() == list(bgr)
    assert swscale_coefficients(6) == (128, 9539, 13075, -3209, -6660, 16525)
    assert swscale_coefficients(6, full_range=True) == (0, 8192, 11485, -2819, -5850, 14516)


def test_empty_frame():
    luma, chroma = torch.zeros(0, 5, dtype=torch.uint8), torch.zeros(0, 3, dtype=torch.uint8)
    assert i420_to_bgr(luma, chroma, chroma).shape == (0, 5, 3)


def test_bad_arguments():
    luma, chroma = torch.zeros(4, 6, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8)
    with pytest.raises(TypeError, match="luma must be uint8"):
        i420_to_bgr(luma.float(), chroma, chroma)
    with pytest.raises(TypeError, match="chroma_v must be uint8"):
        i420_to_bgr(luma, chroma, chroma.short())
    with pytest.raises(ValueError, match="chroma_u and chroma_v must have the luma's dimensions"):
        i420_to_bgr(luma[None], chroma, chroma)
    with pytest.raises(ValueError, match="chroma_u and chroma_v must have the luma's dimensions and frames"):
        i420_to_bgr(luma.expand(3, 4, 6), chroma.expand(3, 2, 3), chroma.expand(2, 2, 3))
    with pytest.raises(ValueError, match=r"luma must be 2-D \(rows, columns\) or 3-D"):
        i420_to_bgr(luma[None, None], chroma[None, None], chroma[None, None])
    with pytest.raises(ValueError, match=r"chroma_u must be \[2, 3\]"):
        i420_to_bgr(luma, torch.zeros(2, 2, dtype=torch.uint8), chroma)
    with pytest.raises(ValueError, match=r"chroma_v must be \[3, 4\]"):
        i420_to_bgr(torch.zeros(5, 7, dtype=torch.uint8), torch.zeros(3, 4, dtype=torch.uint8), chroma)
    with pytest.raises(TypeError, match="chroma must be a uint8"):
        nv12_to_bgr(luma, torch.zeros(2, 6))
    with pytest.raises(ValueError, match="chroma must be"):
        nv12_to_bgr(luma, torch.zeros(2, 5, dtype=torch.uint8))
    with pytest.raises(ValueError, match="chroma must hold"):
        nv12_to_bgr(luma, torch.zeros(3, 3, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="chroma must be"):  # frames of chroma without frames of luma
        nv12_to_bgr(luma, torch.zeros(2, 2, 3, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="chroma must be"):  # another number of frames
        nv12_to_bgr(luma.expand(3, 4, 6), torch.zeros(2, 2, 6, dtype=torch.uint8))
    with pytest.raises(ValueError, match="luma must be"):
        nv12_to_bgr(luma[None, None], torch.zeros(1, 1, 2, 6, dtype=torch.uint8))
    with pytest.raises(TypeError, match="luma must be a uint8 tensor, got ndarray"):
        nv12_to_bgr(luma.numpy(), torch.zeros(2, 6, dtype=torch.uint8))
    for colorspace in (3, 8, 10, -1, True, "bt709"):
        with pytest.raises(ValueError, match="colorspace"):
            i420_to_bgr(luma, chroma, chroma, colorspace)
    op = torch.ops.yolo_fastdetect.yuv420_to_bgr
    with pytest.raises(ValueError, match="coefficients must hold 6"):
        op(luma, chroma, chroma, [128, 9539, 13075, -3209, -6660])
    with pytest.raises(ValueError, match="16-bit"):
        op(luma, chroma, chroma, [128, 9539, 13075, -3209, -6660, 1 << 15])


@pytest.mark.parametrize("device", devices())
def test_opcheck(generator, device):
    luma, chroma_u, chroma_v = (plane.to(device) for plane in random_planes(generator, 9, 14, 2))
    batch = [plane.expand(3, *plane.shape) for plane in (luma, chroma_u, chroma_v)]
    for args in ((luma, chroma_u, chroma_v), (luma[:0], chroma_u[:0], chroma_v[:0]), batch,
                 [plane[:0] for plane in batch]):
        torch.library.opcheck(torch.ops.yolo_fastdetect.yuv420_to_bgr.default,
                              (*args, list(swscale_coefficients(1))))


@pytest.mark.cuda
@pytest.mark.parametrize("height, width", [(1, 1), (7, 5), (480, 854), (1080, 1920), (2160, 3840), (97, 171)])
def test_cuda_matches_cpu_on_pitched_surface(generator, height, width):
    """An NVDEC-like NV12 surface: luma rows padded to a 512-byte pitch, the UV plane after a 16-row-aligned luma."""
    pitch, aligned_height = -(-width // 512) * 512, -(-height // 16) * 16
    chroma_height = (height + 1) // 2
    surface = torch.randint(0, 256, (aligned_height + chroma_height, pitch), generator=generator, dtype=torch.uint8)
    luma, chroma = surface[:height, :width], surface[aligned_height:, : 2 * ((width + 1) // 2)]
    on_gpu = surface.cuda()
    gpu_luma, gpu_chroma = on_gpu[:height, :width], on_gpu[aligned_height:, : 2 * ((width + 1) // 2)]
    for colorspace, full_range in ((1, False), (6, True), (9, False)):
        cpu = nv12_to_bgr(luma, chroma, colorspace, full_range)
        cuda = nv12_to_bgr(gpu_luma, gpu_chroma, colorspace, full_range)
        assert cuda.is_cuda and cuda.is_contiguous() and torch.equal(cuda.cpu(), cpu)


@pytest.mark.cuda
def test_cuda_planes_on_two_devices():
    luma, chroma = torch.zeros(4, 6, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="one device"):
        i420_to_bgr(luma.cuda(), chroma, chroma.cuda())
