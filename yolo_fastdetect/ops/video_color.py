"""Decoded video frames (YUV 4:2:0, 8-bit) to BGR as OpenCV's video reader converts them:
``yolo_fastdetect::yuv420_to_bgr`` (CPU and CUDA).

Stock Ultralytics reads video with ``cv2.VideoCapture``: FFmpeg decodes (exactly, by the codec's standard), then
FFmpeg's swscale converts the frame to BGR24 with the stream's colour matrix and range (OpenCV 4.13 on; BT.601 and
the pixel format's range before). On x86, for a frame of even height, that is swscale's unscaled SIMD converter:
16-bit fixed-point coefficients, products floored, each chroma sample used for its 2x2 pixels. :func:`nv12_to_bgr`
(NVDEC's layout) and :func:`i420_to_bgr` (three planes, as PyAV and FFmpeg's software decoders give) compute the
same bytes; :func:`yuv420_to_bgr_reference` is the readable numpy version. :func:`opencv_conversion` says for which
frames that holds, and with which colour parameters (they depend on the OpenCV version); docs/video_design.md says
what differs.
"""

from __future__ import annotations

import numpy as np
import torch

from .._ext import on_load, require

__all__ = [
    "i420_to_bgr",
    "nv12_to_bgr",
    "opencv_conversion",
    "swscale_coefficients",
    "yuv420_to_bgr_reference",
]

# swscale's ff_yuv2rgb_coeffs rows {crv, cbu, cgu, cgv} (16.16 fixed point, scaled for limited range), keyed by the
# frame's AVColorSpace. Only the matrices OpenCV's reader converts (from 4.13 on, which uses the frame's matrix): it
# reads no frame, or garbage, for YCgCo (8), BT.2020 constant luminance (10) and later ones. 3 (reserved) is left
# out: no encoder at hand could write it.
_BT601 = (104597, 132201, 25675, 53279)
_MATRICES = {
    0: _BT601,  # "RGB": swscale's table has BT.601 in that row
    1: (117489, 138438, 13975, 34925),  # BT.709
    2: _BT601,  # unspecified
    4: (104448, 132798, 24759, 53109),  # FCC
    5: _BT601,  # BT.470BG
    6: _BT601,  # SMPTE 170M
    7: (117579, 136230, 16907, 35559),  # SMPTE 240M
    9: (110013, 140363, 12277, 42626),  # BT.2020 non-constant luminance
}
# Primaries and transfer characteristics (AVColorPrimaries, AVColorTransferCharacteristic) under which OpenCV's
# conversion is the plain matrix above. Wider gamuts (film, BT.2020, SMPTE 428/431/432) are gamut-mapped and PQ / HLG
# tone-mapped by swscale; log transfers (9, 10) fail to read; unlisted values were not checked.
_PLAIN_PRIMARIES = frozenset({1, 2, 4, 5, 6, 7})
_PLAIN_TRANSFERS = frozenset({1, 2, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 17})


def _checked_colorspace(colorspace: int) -> int:
    if isinstance(colorspace, bool) or not isinstance(colorspace, (int, np.integer)) or colorspace not in _MATRICES:
        raise ValueError(f"colorspace must be an AVColorSpace value OpenCV's reader converts, one of "
                         f"{sorted(_MATRICES)}, got {colorspace!r}")
    return int(colorspace)


def _round_to_int16(value: int) -> int:
    """swscale's roundToInt16: a 16.16 value to the nearest integer, halves up."""
    return (value + (1 << 15)) >> 16


def swscale_coefficients(colorspace: int = 2, full_range: bool = False) -> tuple[int, int, int, int, int, int]:
    """swscale's 16-bit constants ``(y_offset, y_coeff, v2r, u2g, v2g, u2b)`` for a frame of AVColorSpace
    ``colorspace`` and range, as ``ff_yuv2rgb_c_init_tables`` derives them (brightness 0, contrast and saturation 1).

    Args:
        colorspace (int): The frame's AVColorSpace (``frame.colorspace`` in PyAV): 1 BT.709, 2 unspecified,
            5 / 6 BT.601, 9 BT.2020, ... (the keys of the module's table).
        full_range (bool): Full ("pc", JPEG) range: ``color_range == 2`` or a ``yuvj`` pixel format.

    Raises:
        ValueError: ``colorspace`` is not one that OpenCV's reader converts.

    Examples:
        >>> swscale_coefficients(1)
        (128, 9539, 14686, -1747, -4366, 17305)
    """
    crv, cbu, cgu, cgv = _MATRICES[_checked_colorspace(colorspace)]
    luma_scale, luma_offset = 1 << 16, 0
    if full_range:  # C's division of the negated values truncates toward zero, as this one of the positive does
        crv, cbu, cgu, cgv = (value * 224 // 255 for value in (crv, cbu, cgu, cgv))
    else:
        luma_scale, luma_offset = (1 << 16) * 255 // 219, 16 << 16
    return (
        _round_to_int16(luma_offset * 8),
        _round_to_int16(luma_scale * 8192),
        _round_to_int16(crv * 8192),
        _round_to_int16(-cgu * 8192),
        _round_to_int16(-cgv * 8192),
        _round_to_int16(cbu * 8192),
    )


def _version(text: str) -> tuple[int, int]:
    major, minor = (text.split(".") + ["0"])[:2]
    return int(major), int("".join(filter(str.isdigit, minor)) or 0)


# From this OpenCV on, its reader converts with the frame's colour properties (sws_scale_frame, which reads them from
# the frame); before, with BT.601 always and the range of the pixel format alone (sws_scale, swscale's defaults).
_TAGGED_OPENCV = (4, 13)
_FORMATS = {"yuv420p": False, "yuvj420p": True}  # 8-bit 4:2:0 pixel formats, and whether the format is full range


def opencv_conversion(
    height: int,
    colorspace: int = 2,
    color_range: int = 0,
    color_primaries: int = 2,
    color_trc: int = 2,
    pixel_format: str = "yuv420p",
    opencv_version: str | None = None,
) -> tuple[int, bool] | None:
    """The ``(colorspace, full_range)`` with which :func:`nv12_to_bgr` / :func:`i420_to_bgr` give
    ``cv2.VideoCapture``'s frame bit for bit, for a frame with these properties (those of FFmpeg's decoded AVFrame);
    None where cv2 converts otherwise or cannot (then read that stream with cv2).

    OpenCV up to 4.12 converts every frame as BT.601, full range only for a ``yuvj420p`` frame (FFmpeg's H.264 and
    HEVC decoders give one for a full-range stream). From 4.13 on it converts with the frame's matrix and range, and
    gamut- or tone-maps wide-gamut and HDR frames (None here), and reads no frame (5.1) or garbage (4.13 to 5.0)
    of the matrices swscale lacks (None). An odd height takes swscale's scaling path in every version (None).
    Measured on x86 with opencv-python(-headless) 4.12, 4.13, 4.14, 5.0 and 5.1 (docs/video_design.md).

    Args:
        height (int): The frame's height.
        colorspace, color_range, color_primaries, color_trc (int): The frame's AVColorSpace, AVColorRange,
            AVColorPrimaries and AVColorTransferCharacteristic (PyAV's ``frame.colorspace``, ...).
        pixel_format (str): The decoded frame's FFmpeg pixel format ("yuv420p" or "yuvj420p").
        opencv_version (str | None): ``cv2.__version__`` of the reader to match; the installed one when None.

    Examples:
        >>> opencv_conversion(1080, 1, 1, 1, 1, opencv_version="4.13.0")  # BT.709, limited range
        (1, False)
        >>> opencv_conversion(1080, colorspace=1, opencv_version="4.12.0")  # BT.709 tag ignored
        (2, False)
        >>> opencv_conversion(2160, 9, 1, 9, 16, opencv_version="5.1.0") is None  # HDR10: tone-mapped
        True
    """
    if opencv_version is None:
        import cv2

        opencv_version = cv2.__version__
    if height % 2 or pixel_format not in _FORMATS:
        return None
    if _version(opencv_version) < _TAGGED_OPENCV:
        return 2, _FORMATS[pixel_format]
    if colorspace not in _MATRICES or color_primaries not in _PLAIN_PRIMARIES or color_trc not in _PLAIN_TRANSFERS:
        return None
    return int(colorspace), _FORMATS[pixel_format] or color_range == 2


def yuv420_to_bgr_reference(
    luma: np.ndarray, chroma_u: np.ndarray, chroma_v: np.ndarray, colorspace: int = 2, full_range: bool = False
) -> np.ndarray:
    """The (H, W, 3) uint8 BGR frame of three uint8 planes, in numpy integers: swscale's x86 SIMD arithmetic
    (``libswscale/x86/yuv_2_rgb.asm``), the readable form of what the operator computes.

    Every sample is scaled by 8 into 16 bits, offset, and multiplied by a 16-bit coefficient keeping the high half
    of the product (``pmulhw``: floored, no rounding term); the colour terms are added to the luma term and the sum
    clamped to [0, 255]. Chroma sample (r, c) serves pixels (2r..2r+1, 2c..2c+1).

    Args:
        luma (np.ndarray): (H, W) uint8.
        chroma_u (np.ndarray): (ceil(H / 2), ceil(W / 2)) uint8, Cb.
        chroma_v (np.ndarray): Same shape, Cr.
        colorspace (int): AVColorSpace (see :func:`swscale_coefficients`).
        full_range (bool): Full-range samples.

    Returns:
        (np.ndarray): (H, W, 3) uint8 BGR.
    """
    y_offset, y_coeff, v2r, u2g, v2g, u2b = swscale_coefficients(colorspace, full_range)
    height, width = luma.shape

    def chroma_scaled(plane: np.ndarray) -> np.ndarray:
        samples = np.repeat(np.repeat(plane.astype(np.int64), 2, axis=0), 2, axis=1)[:height, :width]
        return samples * 8 - 1024

    u, v = chroma_scaled(chroma_u), chroma_scaled(chroma_v)
    y = ((luma.astype(np.int64) * 8 - y_offset) * y_coeff) >> 16  # >> floors, as pmulhw does
    blue = y + ((u * u2b) >> 16)
    green = y + (((u * u2g) >> 16) + ((v * v2g) >> 16))
    red = y + ((v * v2r) >> 16)
    return np.clip(np.stack([blue, green, red], axis=-1), 0, 255).astype(np.uint8)


def _convert(luma: torch.Tensor, chroma_u: torch.Tensor, chroma_v: torch.Tensor, colorspace: int,
             full_range: bool) -> torch.Tensor:
    coefficients = list(swscale_coefficients(colorspace, bool(full_range)))
    require()
    return torch.ops.yolo_fastdetect.yuv420_to_bgr(luma, chroma_u, chroma_v, coefficients)


def nv12_to_bgr(luma: torch.Tensor, chroma: torch.Tensor, colorspace: int = 2,
                full_range: bool = False) -> torch.Tensor:
    """An NV12 frame (NVDEC's output for 8-bit 4:2:0), or a batch of them, to BGR as ``cv2.VideoCapture`` gives it,
    on the planes' device, in one call.

    Args:
        luma (torch.Tensor): (H, W) uint8 Y plane, or (N, H, W) for N frames; any strides, e.g.
            ``surface[:height, :width]`` of a pitched NVDEC surface.
        chroma (torch.Tensor): The interleaved UV plane, uint8: (ceil(H / 2), ceil(W / 2), 2), or its rows as
            (ceil(H / 2), 2 * ceil(W / 2)) bytes (U first), with the luma's leading N; any row stride.
        colorspace (int): The stream's AVColorSpace (1 BT.709, 2 unspecified, 5 / 6 BT.601, ...).
        full_range (bool): Full-range samples (``color_range == 2``, or a ``yuvj`` format).

    Returns:
        (torch.Tensor): (H, W, 3) or (N, H, W, 3) uint8 BGR, contiguous.

    Raises:
        TypeError: A plane is not uint8.
        ValueError: A plane's shape does not fit the luma's, or ``colorspace`` is not one OpenCV converts.

    Examples:
        >>> luma = torch.full((4, 6), 235, dtype=torch.uint8)
        >>> chroma = torch.full((2, 3, 2), 128, dtype=torch.uint8)
        >>> nv12_to_bgr(luma, chroma)[0, 0].tolist()  # limited-range white
        [255, 255, 255]
    """
    if not isinstance(chroma, torch.Tensor) or chroma.dtype != torch.uint8:
        raise TypeError(f"nv12_to_bgr: chroma must be a uint8 tensor, got {getattr(chroma, 'dtype', type(chroma))}")
    if not isinstance(luma, torch.Tensor):
        raise TypeError(f"nv12_to_bgr: luma must be a uint8 tensor, got {type(luma).__name__}")
    if luma.dim() not in (2, 3):
        raise ValueError(f"nv12_to_bgr: luma must be (rows, columns) or (frames, rows, columns), got "
                         f"{tuple(luma.shape)}")
    if chroma.dim() == luma.dim() and chroma.shape[-1] % 2 == 0:
        chroma = chroma.unflatten(-1, (-1, 2))
    if chroma.dim() != luma.dim() + 1 or chroma.shape[-1] != 2 or chroma.shape[:-3] != luma.shape[:-2]:
        raise ValueError(f"nv12_to_bgr: chroma must be ([frames,] rows, columns, 2) or ([frames,] rows, 2 * columns) "
                         f"as the luma {tuple(luma.shape)}, got {tuple(chroma.shape)}")
    pairs = ((luma.shape[-2] + 1) // 2, (luma.shape[-1] + 1) // 2)
    if tuple(chroma.shape[-3:-1]) != pairs:
        raise ValueError(f"nv12_to_bgr: chroma must hold {pairs} UV pairs for a luma of {tuple(luma.shape)}, got "
                         f"{tuple(chroma.shape)}")
    return _convert(luma, chroma[..., 0], chroma[..., 1], colorspace, full_range)


def i420_to_bgr(luma: torch.Tensor, chroma_u: torch.Tensor, chroma_v: torch.Tensor, colorspace: int = 2,
                full_range: bool = False) -> torch.Tensor:
    """A three-plane 4:2:0 frame (yuv420p / yuvj420p: FFmpeg's software decoders, PyAV's ``frame.planes``) to BGR
    as ``cv2.VideoCapture`` gives it, on the planes' device.

    Args:
        luma (torch.Tensor): (H, W) uint8 Y plane, or (N, H, W) for N frames; any strides.
        chroma_u (torch.Tensor): (ceil(H / 2), ceil(W / 2)) uint8 U (Cb) plane, with the luma's leading N; any
            strides.
        chroma_v (torch.Tensor): The V (Cr) plane, of the same shape.
        colorspace (int): The stream's AVColorSpace (see :func:`nv12_to_bgr`).
        full_range (bool): Full-range samples.

    Returns:
        (torch.Tensor): (H, W, 3) or (N, H, W, 3) uint8 BGR, contiguous.

    Raises:
        TypeError: A plane is not uint8.
        ValueError: A plane's shape does not fit the luma's, or ``colorspace`` is not one OpenCV converts.

    Examples:
        >>> planes = [torch.full((4, 6), 16, dtype=torch.uint8), *[torch.full((2, 3), 128, dtype=torch.uint8)] * 2]
        >>> i420_to_bgr(*planes, colorspace=1)[3, 5].tolist()  # limited-range black
        [0, 0, 0]
    """
    return _convert(luma, chroma_u, chroma_v, colorspace, full_range)


# Fake kernel -----------------------------------------------------------------------------------------------------


def _yuv420_to_bgr_fake(luma, chroma_u, chroma_v, coefficients):
    torch._check(luma.dim() in (2, 3), lambda: "luma must be 2-D (rows, columns) or 3-D (frames, rows, columns)")
    return luma.new_empty((*luma.shape, 3))


@on_load
def _register() -> None:
    torch.library.register_fake("yolo_fastdetect::yuv420_to_bgr")(_yuv420_to_bgr_fake)
