"""Typed wrappers over the ``torch.ops.yolo_fastdetect`` operators, with their fake kernels and references."""

from .detect_decode import detect_decode, detect_decode_reference

__all__ = ["detect_decode", "detect_decode_reference"]
