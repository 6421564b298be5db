// FPN level of each RoI on the CPU, and the argument checks shared with the CUDA launcher.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>

#include "fpn_levels.h"

namespace yolo_fastdetect {

void check_fpn_levels_args(const at::Tensor& rois, int64_t lowest_level, int64_t num_levels, double canonical_size,
                           int64_t canonical_level, double eps, FpnThresholds& thresholds, FpnRoiLayout& layout) {
  TORCH_CHECK_VALUE(rois.dim() == 2 && rois.size(1) == 5,
                    "fpn_levels: rois must be (K, 5) [batch_index, x1, y1, x2, y2], got ", text(rois.sizes()));
  const at::ScalarType dtype = rois.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
                   "fpn_levels: rois must be float32, float64, float16 or bfloat16, got ", dtype);
  TORCH_CHECK_VALUE(num_levels >= 1 && num_levels <= roi_align::kMaxLevels, "fpn_levels: num_levels must be in [1, ",
                    text(roi_align::kMaxLevels), "], got ", text(num_levels));
  TORCH_CHECK_VALUE(std::isfinite(canonical_size) && canonical_size > 0,
                    "fpn_levels: canonical_size must be positive and finite, got ", text(canonical_size));
  TORCH_CHECK_VALUE(std::isfinite(eps), "fpn_levels: eps must be finite, got ", text(eps));

  // Level n is reached when k0 + log2(sqrt(area) / s0) + eps >= n, i.e. area >= s0^2 * 2^(2 * (n - k0 - eps)).
  thresholds.num_levels = static_cast<int>(num_levels);
  thresholds.min_area[0] = 0.0;
  for (int i = 1; i < thresholds.num_levels; ++i) {
    const double exponent = 2.0 * (static_cast<double>(lowest_level + i) - static_cast<double>(canonical_level) - eps);
    thresholds.min_area[i] = canonical_size * canonical_size * std::exp2(exponent);
  }
  layout.count = rois.size(0);
  layout.row_stride = rois.stride(0);
  layout.column_stride = rois.stride(1);
}

namespace {

constexpr int64_t kRoisPerTask = 4096;

at::Tensor fpn_levels_cpu(const at::Tensor& rois, int64_t lowest_level, int64_t num_levels, double canonical_size,
                          int64_t canonical_level, double eps) {
  FpnThresholds thresholds;
  FpnRoiLayout layout;
  check_fpn_levels_args(rois, lowest_level, num_levels, canonical_size, canonical_level, eps, thresholds, layout);
  at::Tensor levels = at::empty({layout.count}, rois.options().dtype(at::kLong));
  if (layout.count == 0) return levels;
  int64_t* out = levels.mutable_data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rois.scalar_type(), "fpn_levels_cpu", [&] {
    const scalar_t* roi_ptr = rois.const_data_ptr<scalar_t>();
    at::parallel_for(0, layout.count, kRoisPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) out[k] = roi_fpn_level(roi_ptr, layout, k, thresholds);
    });
  });
  return levels;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU, m) { m.impl("fpn_levels", &fpn_levels_cpu); }

}  // namespace yolo_fastdetect
