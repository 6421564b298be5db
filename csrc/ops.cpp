// Every operator schema of the library, declared once. Kernels are added next to their code with
// TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU|CUDA, m); fake (meta) kernels and autograd are registered from
// Python (yolo_fastdetect/ops/*.py).
#include <torch/library.h>

TORCH_LIBRARY(yolo_fastdetect, m) {
  // Detect-head decode: DFL expectation (reg_max 16) or identity (reg_max 1), distance-to-box around the
  // anchor centres of every level, times the level stride, and class sigmoid, for all levels in one pass.
  // level_shapes is [h0, w0, h1, w1, ...]; returns (B, 4 + nc, A) in the input dtype.
  m.def(
      "detect_decode(Tensor boxes, Tensor scores, int[] level_shapes, float[] level_strides, int reg_max, "
      "bool xywh) -> Tensor");

  // Batched NMS of the head's output (B, 4 + nc + nm, A), as Ultralytics' non_max_suppression: confidence
  // filter, best class (or every class above conf_thres when multi_label), top max_nms by score, class-offset
  // greedy IoU suppression, max_det kept. Fixed-size outputs: detections (B, max_det, 6 + nm) float32 rows
  // [x1, y1, x2, y2, score, class, extras...] zero-padded, counts (B,) int64, anchor_indices (B, max_det)
  // int64 padded with -1.
  m.def(
      "batched_nms(Tensor prediction, int num_classes, float conf_thres, float iou_thres, int[]? classes, "
      "bool agnostic, bool multi_label, int max_det, int max_nms, float max_wh) -> "
      "(Tensor detections, Tensor counts, Tensor anchor_indices)");
}
