"""What the loaders check in a JPEG's bytes before a decoder other than stock's may take it (the list's OpenCV route,
nvJPEG)."""

from __future__ import annotations

import numpy as np

_JPEG_END = b"\xff\xd9"  # EOI


def ends_in_eoi(data: np.ndarray) -> bool:
    """Whether a JPEG's bytes end in its EOI marker: without it Pillow raises "image file is truncated" where OpenCV
    (and nvJPEG) decode what is there, so only a complete file may leave Pillow's route.

    Examples:
        >>> ends_in_eoi(np.frombuffer(b"\\xff\\xd8...\\xff\\xd9", np.uint8))
        True
    """
    return data.size >= 2 and data[-2:].tobytes() == _JPEG_END
