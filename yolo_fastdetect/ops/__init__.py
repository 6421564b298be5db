"""Typed wrappers over the ``torch.ops.yolo_fastdetect`` operators, with their fake kernels and references."""

from .area_attention import area_attention_block, area_attention_block_reference
from .detect_decode import detect_decode, detect_decode_reference
from .letterbox import LetterboxGeometry, letterbox, letterbox_geometry, scale_boxes_batch
from .match_predictions import match_predictions
from .multiscale_roi_align import MultiScaleRoIAlign, fpn_levels, multiscale_roi_align
from .nms import BatchDetections, batched_nms, non_max_suppression, non_max_suppression_reference
from .roi_align import RoIAlign, boxes_to_rois, roi_align, roi_align_reference
from .video_color import (
    i420_to_bgr,
    nv12_to_bgr,
    opencv_conversion,
    swscale_coefficients,
    yuv420_to_bgr_reference,
)

__all__ = [
    "BatchDetections",
    "LetterboxGeometry",
    "MultiScaleRoIAlign",
    "RoIAlign",
    "area_attention_block",
    "area_attention_block_reference",
    "batched_nms",
    "boxes_to_rois",
    "detect_decode",
    "detect_decode_reference",
    "fpn_levels",
    "i420_to_bgr",
    "letterbox",
    "letterbox_geometry",
    "match_predictions",
    "multiscale_roi_align",
    "non_max_suppression",
    "non_max_suppression_reference",
    "nv12_to_bgr",
    "opencv_conversion",
    "roi_align",
    "roi_align_reference",
    "scale_boxes_batch",
    "swscale_coefficients",
    "yuv420_to_bgr_reference",
]
