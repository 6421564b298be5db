"""Pinned host memory: the val loader's batches and the PyAV planes' staging (:func:`pinned_empty`), the host copies
of frames converted on the GPU (:func:`host_copy_buffer`), and numpy arrays a video reader that uploads ahead
retrieves frames into, so that their copies to the GPU start from where cv2 wrote them, with no copy on the host
first.

The memory is a tensor of PyTorch's caching host allocator, which the array keeps alive (``array.base``). A copy to
the GPU made from that tensor records its stream with the allocator, which reuses a freed block only once the copies
that read it have completed; :func:`pinned_tensor_of` gives the tensor back for that copy. The allocator keeps the
blocks it made for the life of the process, so frames a caller holds (``stream=False`` on a long video) are pinned
only up to :data:`PINNED_BUDGET_BYTES` in use; past it they go to pageable memory, as stock's are.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# Pinned memory in use in the process (torch.cuda.host_memory_stats' active bytes) above which no more frames are
# pinned: about 250 1080p frames (8 MB blocks), four times what the video readers hold decoded ahead at most.
PINNED_BUDGET_BYTES = 2 << 30


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in pinned host memory, from PyTorch's caching host allocator (which reuses freed
    blocks)."""
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def within_pinned_budget(nbytes: int) -> bool:
    """Whether ``nbytes`` more pinned memory keep the process's pinned memory in use (PyTorch's caching host
    allocator's active bytes) within :data:`PINNED_BUDGET_BYTES`; False where that cannot be read (no CUDA)."""
    try:
        return torch.cuda.host_memory_stats().get("active_bytes.current", 0) + nbytes <= PINNED_BUDGET_BYTES
    except RuntimeError:
        return False


def host_copy_buffer(shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised host tensor for a copy from the GPU: pinned (the copy runs asynchronously) while
    :func:`within_pinned_budget`, pageable past it or where no pinned memory can be had.

    Examples:
        >>> host = host_copy_buffer((8, 720, 1280, 3))  # doctest: +SKIP
        >>> host.copy_(frames_on_the_gpu, non_blocking=True)  # doctest: +SKIP
    """
    if within_pinned_budget(math.prod(shape) * dtype.itemsize):
        try:
            return pinned_empty(shape, dtype)
        except RuntimeError:  # no pinned memory to be had
            pass
    return torch.empty(shape, dtype=dtype)


def pinned_array(shape: tuple[int, ...]) -> np.ndarray | None:
    """An uninitialised uint8 array of ``shape`` in pinned host memory, or None where none can be had or the pinned
    memory in use would exceed :data:`PINNED_BUDGET_BYTES`.

    Examples:
        >>> frame = pinned_array((720, 1280, 3))  # doctest: +SKIP
        >>> pinned_tensor_of(frame).is_pinned()  # doctest: +SKIP
        True
    """
    if not within_pinned_budget(math.prod(shape)):
        return None
    try:
        return pinned_empty(shape, torch.uint8).numpy()
    except RuntimeError:  # no pinned memory to be had: pageable it is
        return None


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
