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
}
