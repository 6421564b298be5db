"""Pinned host memory: the val loader's batches and the PyAV planes' staging (:func:`pinned_empty`), the host copies
of frames converted on the GPU (:func:`host_copy_buffer`), and numpy arrays a video reader that uploads ahead
retrieves frames into, so that their copies to the GPU start from where cv2 wrote them, with no copy on the host
first.

The memory is a tensor of PyTorch's caching host allocator, which the array keeps alive (``array.base``). A copy to
the GPU made from that tensor records its stream with the allocator, which reuses a freed block only once the copies
that read it have completed; :func:`pinned_tensor_of` gives the tensor back for that copy. The allocator keeps the
blocks it made for the life of the process, so frames a caller holds (``stream=False`` on a long video) are pinned
only up to :data:`PINNED_BUDGET_BYTES` held; past it they go to pageable memory, as stock's are.

The frames held are counted here, each buffer from its allocation to its garbage collection. The allocator's own
count of memory in use (``host_memory_stats``' active bytes) is not that: it keeps a freed block counted until it
has processed the events of the copies that used it, and it processes them oldest first, stopping at the first not
yet complete. While a GPU predictor and its video readers keep copies in flight, freed blocks stayed counted: after
a few passes of eight 1080p streams it read 2.7 GB with no frame held, every host copy went to pageable memory, and
the PyAV planes' conversion took 33 ms a frame instead of 0.3 (docs/video_design.md, Pinned memory).
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np
import torch

# Bytes of pinned frames held (host copies and frame arrays made here, not yet garbage-collected) above which no more
# frames are pinned: about 250 1080p frames (8 MB blocks), four times what the video readers hold decoded ahead at
# most.
PINNED_BUDGET_BYTES = 2 << 30

_held_bytes = 0  # the pinned frames' bytes held now
_held_lock = threading.Lock()


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in pinned host memory, from PyTorch's caching host allocator (which reuses freed
    blocks)."""
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def pinned_bytes_held() -> int:
    """Bytes of the pinned frames that :func:`host_copy_buffer` and :func:`pinned_array` made and that are still
    referenced."""
    return _held_bytes


def within_pinned_budget(nbytes: int) -> bool:
    """Whether ``nbytes`` more pinned frames keep :func:`pinned_bytes_held` within :data:`PINNED_BUDGET_BYTES`; False
    without CUDA (no pinned memory to be had)."""
    return torch.cuda.is_available() and _held_bytes + nbytes <= PINNED_BUDGET_BYTES


def _release(nbytes: int) -> None:
    global _held_bytes
    with _held_lock:
        _held_bytes -= nbytes


def _pinned_frame(shape: tuple[int, ...]) -> np.ndarray | None:
    """An uninitialised pinned uint8 array counted in :func:`pinned_bytes_held` until it and every array or tensor
    made from it are garbage-collected, or None where it would exceed :data:`PINNED_BUDGET_BYTES` or no pinned memory
    can be had."""
    global _held_bytes
    nbytes = math.prod(shape)
    with _held_lock:
        if not within_pinned_budget(nbytes):
            return None
        _held_bytes += nbytes
    try:
        array = pinned_empty(shape, torch.uint8).numpy()
    except RuntimeError:  # no pinned memory to be had
        _release(nbytes)
        return None
    # The tensor the array holds (array.base), which numpy's views of it hold in turn: it is collected last.
    weakref.finalize(array.base, _release, nbytes)
    return array


def host_copy_buffer(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 host tensor for a copy from the GPU: pinned (the copy runs asynchronously) while
    :func:`within_pinned_budget`, pageable past it or where no pinned memory can be had.

    Examples:
        >>> host = host_copy_buffer((8, 720, 1280, 3))  # doctest: +SKIP
        >>> host.copy_(frames_on_the_gpu, non_blocking=True)  # doctest: +SKIP
    """
    pinned = _pinned_frame(shape)
    # (from the array, so that the tensor and the arrays made of it hold what the count waits for)
    return torch.from_numpy(pinned) if pinned is not None else torch.empty(shape, dtype=torch.uint8)


def pinned_array(shape: tuple[int, ...]) -> np.ndarray | None:
    """An uninitialised uint8 array of ``shape`` in pinned host memory, or None where none can be had or the pinned
    frames held would exceed :data:`PINNED_BUDGET_BYTES`.

    Examples:
        >>> frame = pinned_array((720, 1280, 3))  # doctest: +SKIP
        >>> pinned_tensor_of(frame).is_pinned()  # doctest: +SKIP
        True
    """
    return _pinned_frame(shape)


def pinned_tensor_of(array: np.ndarray) -> torch.Tensor | None:
    """The pinned tensor whose bytes ``array`` is, in the same row-major order (made by :func:`pinned_array`), or
    None.

    Examples:
        >>> pinned_tensor_of(np.zeros((4, 6, 3), np.uint8)) is None
        True
    """
    base = array.base
    if (isinstance(base, torch.Tensor) and array.flags.c_contiguous and base.data_ptr() == array.ctypes.data
            and base.numel() == array.size and base.dtype == torch.uint8 and base.is_contiguous()
            and base.is_pinned()):
        return base
    return None
