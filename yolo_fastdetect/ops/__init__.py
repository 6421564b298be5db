"""Typed wrappers over the ``torch.ops.yolo_fastdetect`` operators, with their fake kernels and references."""

from .detect_decode import detect_decode, detect_decode_reference
from .nms import batched_nms, non_max_suppression, non_max_suppression_reference

__all__ = [
    "batched_nms",
    "detect_decode",
    "detect_decode_reference",
    "non_max_suppression",
    "non_max_suppression_reference",
]
