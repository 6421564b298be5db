// Batched NMS of the Detect head's output: per-candidate math shared by the CPU and CUDA kernels.
//
// Input (Ultralytics 8.4 `non_max_suppression`): prediction (B, 4 + nc + nm, A): rows cx, cy, w, h, then nc
// class scores, then nm extra channels (mask coefficients, keypoints), anchors along the last dimension.
// Every rule below reproduces a step of the stock function, including where it computes in the input dtype:
//   - an anchor is considered when its best class score passes conf_thres; the best class is the first maximum
//     (torch.max); any NaN class score makes the anchor's amax NaN, which never passes, so the anchor is dropped;
//   - single label: one candidate (anchor, best class); multi label: one per class whose score passes;
//   - the candidates' order is descending score, ties broken by ascending `anchor * nc + class` (the row order
//     stock hands to a stable sort); only the first max_nms of that order enter the suppression;
//   - boxes are converted xywh -> xyxy in the input dtype, then promoted to float32 and offset by class * max_wh
//     (unless agnostic) for the IoU test; greedy suppression as torchvision.ops.nms, keeping max_det boxes.
// Output rows (float32): x1, y1, x2, y2, score, class, extras.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "../common.h"

namespace yolo_fastdetect {

// Kernel parameters are passed by value, so the class filter has a fixed capacity.
constexpr int kMaxClassFilter = 64;

struct NmsParams {
  int64_t batch;
  int64_t num_anchors;
  int64_t num_classes;
  int64_t num_extra;
  int64_t strides[3];  // element strides of prediction along (B, C, A)
  float conf_thres;    // conf_thres rounded to the input dtype: torch compares a tensor and a scalar that way
  bool multi_label;    // already false when nc == 1, as stock
  float class_offset;  // max_wh, or 0 when agnostic
  int64_t max_det;
  int64_t max_candidates;  // min(max_nms, candidates an image can have): capacity of the per-image sort
  int key_bits;            // bits of the candidate index in a sort key
  int class_filter_size;   // -1: every class passes
  int64_t class_filter[kMaxClassFilter];
};

// A float's bits and back (host and device).
YFD_HOST_DEVICE uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

YFD_HOST_DEVICE float float_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

// A candidate's sort key: its float32 score bits (positive floats order like their bits) above the inverted
// candidate index, so that sorting keys in descending order sorts by score descending, then index ascending.
// Keys are unique, which makes every selection and sort deterministic.
YFD_HOST_DEVICE uint64_t sort_key(float score, int64_t candidate_index, const NmsParams& params) {
  const uint32_t score_bits = float_bits(score);
  const uint64_t last_index = static_cast<uint64_t>(params.num_anchors * params.num_classes - 1);
  return (static_cast<uint64_t>(score_bits) << params.key_bits) | (last_index - static_cast<uint64_t>(candidate_index));
}

// Bits of a sort key: 31 bits of a positive float score above key_bits of index.
YFD_HOST_DEVICE int sort_key_bits(const NmsParams& params) { return 31 + params.key_bits; }

YFD_HOST_DEVICE float key_score(uint64_t key, const NmsParams& params) {
  return float_from_bits(static_cast<uint32_t>(key >> params.key_bits));
}

YFD_HOST_DEVICE int64_t key_candidate_index(uint64_t key, const NmsParams& params) {
  const uint64_t last_index = static_cast<uint64_t>(params.num_anchors * params.num_classes - 1);
  const uint64_t index_mask = (uint64_t{1} << params.key_bits) - 1;
  return static_cast<int64_t>(last_index - (key & index_mask));
}

YFD_HOST_DEVICE bool class_passes_filter(int64_t cls, const NmsParams& params) {
  if (params.class_filter_size < 0) return true;
  for (int k = 0; k < params.class_filter_size; ++k)
    if (params.class_filter[k] == cls) return true;
  return false;
}

// Calls visit(class, score) for every candidate of one anchor whose scores have been scanned: best_score is their
// first maximum (torch.max's), of class best_class, and has_nan whether any is NaN. `scores` points at the anchor's
// class 0 score, consecutive classes `class_stride` elements apart.
template <typename scalar_t, typename Visit>
YFD_HOST_DEVICE void visit_scanned_anchor(const scalar_t* scores, int64_t class_stride, int64_t best_class,
                                          float best_score, bool has_nan, const NmsParams& params, Visit&& visit) {
  if (has_nan || !(best_score > params.conf_thres)) return;
  if (!params.multi_label) {
    if (class_passes_filter(best_class, params)) visit(best_class, best_score);
    return;
  }
  for (int64_t cls = 0; cls < params.num_classes; ++cls) {
    const float score = static_cast<float>(scores[cls * class_stride]);
    if (score > params.conf_thres && class_passes_filter(cls, params)) visit(cls, score);
  }
}

// Calls visit(class, score) for every candidate of one anchor (scores as for visit_scanned_anchor).
template <typename scalar_t, typename Visit>
YFD_HOST_DEVICE void for_each_candidate(const scalar_t* scores, int64_t class_stride, const NmsParams& params,
                                        Visit&& visit) {
  float best_score = -INFINITY;
  int64_t best_class = 0;
  bool has_nan = false;
  for (int64_t cls = 0; cls < params.num_classes; ++cls) {
    const float score = static_cast<float>(scores[cls * class_stride]);
    has_nan |= score != score;
    if (score > best_score) {  // strict: the first maximum wins, as torch.max
      best_score = score;
      best_class = cls;
    }
  }
  visit_scanned_anchor(scores, class_stride, best_class, best_score, has_nan, params, visit);
}

// xywh -> xyxy as Ultralytics' xywh2xyxy computes it on a tensor of the input dtype: w / 2, then c -/+ w / 2,
// each rounded to that dtype; the result promoted to float32.
template <typename scalar_t>
YFD_HOST_DEVICE void anchor_box_xyxy(const scalar_t* box, int64_t channel_stride, float (&xyxy)[4]) {
  for (int axis = 0; axis < 2; ++axis) {
    const float centre = static_cast<float>(box[axis * channel_stride]);
    const float half_size =
        static_cast<float>(static_cast<scalar_t>(static_cast<float>(box[(axis + 2) * channel_stride]) / 2.f));
    xyxy[axis] = static_cast<float>(static_cast<scalar_t>(centre - half_size));
    xyxy[axis + 2] = static_cast<float>(static_cast<scalar_t>(centre + half_size));
  }
}

// Float arithmetic rounded after every operation, as separate tensor ops round: on the GPU the intrinsics stop
// nvcc from contracting a multiply and an add into one FMA, which rounds once.
#if defined(__CUDA_ARCH__)
#define YFD_MUL(a, b) __fmul_rn(a, b)
#define YFD_ADD(a, b) __fadd_rn(a, b)
#define YFD_SUB(a, b) __fsub_rn(a, b)
#else
#define YFD_MUL(a, b) ((a) * (b))
#define YFD_ADD(a, b) ((a) + (b))
#define YFD_SUB(a, b) ((a) - (b))
#endif

// Whether box `later` is suppressed by box `earlier` (higher in the score order): IoU > threshold, computed as
// torchvision's CPU kernel and Ultralytics' TorchNMS compute it. The caller picks the threshold's type: double
// reproduces torchvision's CPU kernel, a float-rounded value TorchNMS and torchvision's CUDA kernel.
template <typename Threshold>
YFD_HOST_DEVICE bool iou_above(const float (&earlier)[4], const float (&later)[4], Threshold threshold) {
  const float left = fmaxf(earlier[0], later[0]), right = fminf(earlier[2], later[2]);
  const float top = fmaxf(earlier[1], later[1]), bottom = fminf(earlier[3], later[3]);
  const float width = fmaxf(YFD_SUB(right, left), 0.f), height = fmaxf(YFD_SUB(bottom, top), 0.f);
  const float intersection = YFD_MUL(width, height);
  const float earlier_area = YFD_MUL(YFD_SUB(earlier[2], earlier[0]), YFD_SUB(earlier[3], earlier[1]));
  const float later_area = YFD_MUL(YFD_SUB(later[2], later[0]), YFD_SUB(later[3], later[1]));
  const float union_area = YFD_SUB(YFD_ADD(earlier_area, later_area), intersection);
  return intersection / union_area > threshold;  // 0 / 0 (two zero-area boxes) is NaN: not above
}

// One candidate ready for suppression and output: its box (xyxy, float32) and the same box offset by class.
struct Candidate {
  int64_t anchor;
  int64_t cls;
  float score;
  float box[4];
  float offset_box[4];
};

template <typename scalar_t>
YFD_HOST_DEVICE Candidate decode_candidate(const scalar_t* image_prediction, uint64_t key, const NmsParams& params) {
  Candidate candidate;
  const int64_t index = key_candidate_index(key, params);
  candidate.anchor = index / params.num_classes;
  candidate.cls = index - candidate.anchor * params.num_classes;
  candidate.score = key_score(key, params);
  anchor_box_xyxy(image_prediction + candidate.anchor * params.strides[2], params.strides[1], candidate.box);
  const float offset = YFD_MUL(static_cast<float>(candidate.cls), params.class_offset);
  for (int k = 0; k < 4; ++k) candidate.offset_box[k] = YFD_ADD(candidate.box[k], offset);
  return candidate;
}

// Writes a kept candidate's output row: x1, y1, x2, y2, score, class, then the anchor's extra channels.
template <typename scalar_t>
YFD_HOST_DEVICE void write_detection(const scalar_t* image_prediction, const Candidate& candidate,
                                     const NmsParams& params, float* row) {
  for (int k = 0; k < 4; ++k) row[k] = candidate.box[k];
  row[4] = candidate.score;
  row[5] = static_cast<float>(candidate.cls);
  const scalar_t* extras =
      image_prediction + (4 + params.num_classes) * params.strides[1] + candidate.anchor * params.strides[2];
  for (int64_t e = 0; e < params.num_extra; ++e) row[6 + e] = static_cast<float>(extras[e * params.strides[1]]);
}

// Validates the operator's arguments (raising errors that name the argument) and fills the parameters that do
// not depend on the dtype. Defined in nms_cpu.cpp, used by both launchers.
void check_nms_args(const at::Tensor& prediction, int64_t num_classes, double conf_thres, double iou_thres,
                    at::OptionalIntArrayRef classes, bool agnostic, bool multi_label, int64_t max_det, int64_t max_nms,
                    double max_wh, NmsParams& params);

// conf_thres as torch compares it with a tensor of the prediction's dtype: the scalar rounded to that dtype.
float conf_thres_in_dtype(double conf_thres, at::ScalarType dtype);

// The operator's outputs, unfilled, on `options`' device: detections (B, max_det, 6 + num_extra) float32, counts (B,)
// and the detections' anchor indices (B, max_det), int64.
std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_nms_outputs(const NmsParams& params,
                                                                 const at::TensorOptions& options);

}  // namespace yolo_fastdetect
