// Validation's matching of detections to labels (Ultralytics' BaseValidator.match_predictions, greedy form) on the
// CPU: the per-detection loop that stock runs in numpy, one detection at a time, in one call.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "../common.h"

namespace yolo_fastdetect {
namespace {

// numpy's argmax over `count` values read by `value(m)`: the first maximum, or the first NaN where there is one.
template <typename Value>
int64_t first_argmax(int64_t count, const Value& value) {
  int64_t best = 0;
  float best_value = value(0);
  if (std::isnan(best_value)) return 0;
  for (int64_t m = 1; m < count; ++m) {
    const float candidate = value(m);
    if (std::isnan(candidate)) return m;
    if (candidate > best_value) {
      best = m;
      best_value = candidate;
    }
  }
  return best;
}

// iou (M, N) float32: labels x detections, zero where the classes differ, detections in descending confidence.
// thresholds (T,) float32. Returns correct (N, T) bool: for each threshold, each detection in order claims the
// unclaimed label of highest IoU (the first on a tie) and is correct where that IoU reaches the threshold.
at::Tensor match_predictions_cpu(const at::Tensor& iou, const at::Tensor& thresholds) {
  TORCH_CHECK_VALUE(iou.dim() == 2, "match_predictions: iou must be (labels, detections), got ", text(iou.sizes()));
  TORCH_CHECK_VALUE(thresholds.dim() == 1, "match_predictions: thresholds must be 1-D, got ", text(thresholds.sizes()));
  TORCH_CHECK_TYPE(iou.scalar_type() == at::kFloat, "match_predictions: iou must be float32, got ", iou.scalar_type());
  TORCH_CHECK_TYPE(thresholds.scalar_type() == at::kFloat, "match_predictions: thresholds must be float32, got ",
                   thresholds.scalar_type());
  const int64_t labels = iou.size(0), detections = iou.size(1), levels = thresholds.size(0);
  at::Tensor correct = at::zeros({detections, levels}, iou.options().dtype(at::kBool));
  if (labels == 0 || detections == 0 || levels == 0) return correct;

  const at::Tensor iou_values = iou.contiguous(), threshold_values = thresholds.contiguous();
  const float* overlap = iou_values.const_data_ptr<float>();
  const float* threshold = threshold_values.const_data_ptr<float>();
  bool* out = correct.mutable_data_ptr<bool>();
  // numpy's min: NaN where any threshold is NaN, and then no IoU reaches it.
  float lowest = threshold[0];
  for (int64_t t = 1; t < levels && !std::isnan(lowest); ++t) {
    lowest = std::isnan(threshold[t]) || threshold[t] < lowest ? threshold[t] : lowest;
  }
  std::vector<uint8_t> claimed(static_cast<size_t>(labels * levels), 0);  // (M, T): labels taken per threshold
  for (int64_t j = 0; j < detections; ++j) {
    bool reaches_lowest = false;  // stock visits only these detections; for the others nothing changes
    for (int64_t m = 0; m < labels && !reaches_lowest; ++m) reaches_lowest = overlap[m * detections + j] >= lowest;
    if (!reaches_lowest) continue;
    for (int64_t t = 0; t < levels; ++t) {
      const auto available = [&](int64_t m) { return claimed[m * levels + t] ? 0.f : overlap[m * detections + j]; };
      const int64_t best = first_argmax(labels, available);
      const bool hit = available(best) >= threshold[t];
      out[j * levels + t] = hit;
      if (hit) claimed[best * levels + t] = 1;
    }
  }
  return correct;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU, m) { m.impl("match_predictions", &match_predictions_cpu); }

}  // namespace yolo_fastdetect
