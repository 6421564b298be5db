// Every operator schema of the library, declared once. Kernels are added next to their code with
// TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU|CUDA, m); fake (meta) kernels are registered from Python
// (yolo_fastdetect/ops/*.py), and so would autograd be, except for RoIAlign's, which is registered in C++
// (csrc/roi_align/roi_align_autograd.cpp) to save the Python autograd's host time on every call.
#include <torch/library.h>

TORCH_LIBRARY(yolo_fastdetect, m) {
  // Detect-head decode: DFL expectation (reg_max 16) or identity (reg_max 1), distance-to-box around the
  // anchor centres of every level, times the level stride, and class sigmoid, for all levels in one pass.
  // level_shapes is [h0, w0, h1, w1, ...]; returns (B, 4 + nc, A) in the input dtype. SymInt[]: under
  // torch.compile with dynamic shapes the grid sizes are symbols, and with int[] inductor baked the sizes of the
  // shape it traced into the graph without a guard (the next input shape failed the anchor-count check).
  m.def(
      "detect_decode(Tensor boxes, Tensor scores, SymInt[] level_shapes, float[] level_strides, int reg_max, "
      "bool xywh) -> Tensor");

  // RoIAlign (mmcv / torchvision semantics): pools every RoI [batch_index, x1, y1, x2, y2] (input pixels) of
  // rois (K, 5) into (K, C, pooled_height, pooled_width). sampling_ratio <= 0 samples ceil(bin size) points per
  // bin side; aligned shifts by half a pixel; max_mode pools the largest sample instead of the mean. Returns the
  // pooled features and, in max mode, the int32 index of the chosen sample per output (empty otherwise), which
  // the backward pass takes back. input_shape / feature_shapes are (N, C, H, W) of each level, flattened.
  m.def(
      "roi_align(Tensor input, Tensor rois, int pooled_height, int pooled_width, float spatial_scale, "
      "int sampling_ratio, bool aligned, bool max_mode) -> (Tensor, Tensor)");
  m.def(
      "roi_align_backward(Tensor grad_output, Tensor rois, Tensor argmax, SymInt[] input_shape, "
      "float spatial_scale, int sampling_ratio, bool aligned, bool max_mode) -> Tensor");
  // FPN level of each RoI of rois (K, 5) (torchvision's LevelMapper): floor(canonical_level +
  // log2(sqrt(area) / canonical_size) + eps) clamped to [lowest_level, lowest_level + num_levels), minus
  // lowest_level, as int64 (K,); -1 where the area is NaN or negative. Computed from area thresholds, no log2.
  m.def(
      "fpn_levels(Tensor rois, int lowest_level, int num_levels, float canonical_size, int canonical_level, "
      "float eps) -> Tensor");
  // Multi-level RoIAlign in one pass: RoI k is pooled from features[roi_levels[k]] with that level's
  // spatial scale (levels share N and C). A level or batch index out of range pools zeros.
  m.def(
      "multiscale_roi_align(Tensor[] features, Tensor rois, Tensor roi_levels, int pooled_height, "
      "int pooled_width, float[] spatial_scales, int sampling_ratio, bool aligned, bool max_mode) -> (Tensor, Tensor)");
  m.def(
      "multiscale_roi_align_backward(Tensor grad_output, Tensor rois, Tensor roi_levels, Tensor argmax, "
      "SymInt[] feature_shapes, float[] spatial_scales, int sampling_ratio, bool aligned, bool max_mode) -> Tensor[]");

  // Batched NMS of the head's output (B, 4 + nc + nm, A), as Ultralytics' non_max_suppression: confidence
  // filter, best class (or every class above conf_thres when multi_label), top max_nms by score, class-offset
  // greedy IoU suppression, max_det kept. Fixed-size outputs: detections (B, max_det, 6 + nm) float32 rows
  // [x1, y1, x2, y2, score, class, extras...] zero-padded, counts (B,) int64, anchor_indices (B, max_det)
  // int64 padded with -1.
  m.def(
      "batched_nms(Tensor prediction, int num_classes, float conf_thres, float iou_thres, int[]? classes, "
      "bool agnostic, bool multi_label, int max_det, int max_nms, float max_wh) -> "
      "(Tensor detections, Tensor counts, Tensor anchor_indices)");

  // Letterbox preprocessing of a batch of uint8 BGR images of any sizes, in one launch: images holds them back to
  // back (each (H, W, 3) row-major, flat), image_params (B, 7) int64, on the CPU, gives per image [byte offset,
  // height, width, resized_height, resized_width, pad_top, pad_left]. Each image is resized with cv::resize
  // INTER_LINEAR (8-bit fixed-point arithmetic), placed at (pad_top, pad_left) on out's canvas of 114, BGR -> RGB,
  // HWC -> CHW; every byte u becomes value_table[u] (256 values, e.g. u / 255 in the model dtype). Writes out
  // (B, 3, height, width), contiguous, in value_table's dtype.
  m.def("letterbox(Tensor images, Tensor image_params, Tensor value_table, Tensor(a!) out) -> ()");
  // The letterbox's host staging (CPU only): each contiguous uint8 image of images copied into packed (flat uint8,
  // contiguous, e.g. pinned memory) at its byte offset, over at most four threads.
  m.def("pack_images(Tensor(a!) packed, Tensor[] images, int[] offsets) -> ()");

  // YUV 4:2:0 (8-bit) to BGR24 as OpenCV's video reader converts it on x86 (swscale's unscaled SIMD converter, 16-bit
  // fixed point, each chroma sample serving its 2x2 pixels). luma (H, W), chroma_u and chroma_v (ceil(H / 2),
  // ceil(W / 2)): uint8, any strides (an NVDEC surface's pitch, the halves of an NV12 plane). coefficients: swscale's
  // [y_offset, y_coeff, v2r, u2g, v2g, u2b] for the stream's matrix and range. Returns (H, W, 3) uint8, contiguous.
  m.def("yuv420_to_bgr(Tensor luma, Tensor chroma_u, Tensor chroma_v, int[] coefficients) -> Tensor");

  // Validation's matching (CPU only), Ultralytics' greedy match_predictions: iou (M, N) float32 of labels x
  // detections (zero across classes, detections by descending confidence), thresholds (T,) float32. For each
  // threshold each detection in turn claims the unclaimed label of highest IoU (numpy's argmax: the first maximum,
  // or the first NaN) and is correct where that IoU reaches the threshold. Returns correct (N, T) bool.
  m.def("match_predictions(Tensor iou, Tensor thresholds) -> Tensor");

  // YOLO12's area-attention block of a fused model (Ultralytics' ABlock: AAttn, then its MLP), making the ATen calls
  // the Python modules make (CompositeImplicitAutograd, every device). weights, biases, paddings and groups: the
  // five convolutions (stride 1) in the order qkv, pe, proj, mlp.0 (followed by SiLU), mlp.1. scale_queries: the
  // queries are scaled by head_dim ** -0.5 before their product with the keys (8.4.1xx on), else the product is.
  // Returns (B, C, H, W).
  m.def(
      "area_attention_block(Tensor x, Tensor[] weights, Tensor[] biases, int[] paddings, int[] groups, "
      "int num_heads, int area, bool scale_queries) -> Tensor");
}
