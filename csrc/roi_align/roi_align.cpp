// RoIAlign's argument checks, shared by the CPU and CUDA launchers (declared in roi_align.h): device-neutral, they
// raise errors that name the argument at fault before a kernel runs.
#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "roi_align.h"

namespace yolo_fastdetect {
namespace roi_align {
namespace {

bool supported_dtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kDouble;
}

PoolParams pool_params(const char* op, int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio,
                       bool aligned, bool max_mode) {
  TORCH_CHECK_VALUE(pooled_height > 0 && pooled_width > 0, op, ": output_size must be positive, got (",
                    text(pooled_height), ", ", text(pooled_width), ")");
  // The CUDA kernels count bins in 32 bits.
  TORCH_CHECK_VALUE(pooled_height <= std::numeric_limits<int32_t>::max() / pooled_width, op,
                    ": output_size must have fewer than 2^31 bins, got (", text(pooled_height), ", ",
                    text(pooled_width), ")");
  // The max-mode argmax stores iy * grid_w + ix in int32.
  TORCH_CHECK_VALUE(sampling_ratio <= (1 << 15), op, ": sampling_ratio must be at most 32768, got ",
                    text(sampling_ratio));
  // The CUDA kernels compare a side's samples (output side x sampling_ratio) with the tap tables in 32 bits.
  TORCH_CHECK_VALUE(sampling_ratio <= 0 ||
                        std::max(pooled_height, pooled_width) * sampling_ratio <= std::numeric_limits<int32_t>::max(),
                    op, ": output_size x sampling_ratio must be below 2^31 samples per side, got (",
                    text(pooled_height), ", ", text(pooled_width), ") x ", text(sampling_ratio));
  return PoolParams{pooled_height, pooled_width, sampling_ratio, aligned, max_mode};
}

void check_rois(const char* op, const at::Tensor& rois, at::ScalarType feature_dtype, at::Device device) {
  TORCH_CHECK_VALUE(rois.dim() == 2 && rois.size(1) == 5, op,
                    ": rois must be (K, 5) [batch_index, x1, y1, x2, y2], got shape ", text(rois.sizes()));
  const bool float32_boxes_for_16bit =
      rois.scalar_type() == at::kFloat && (feature_dtype == at::kHalf || feature_dtype == at::kBFloat16);
  TORCH_CHECK_TYPE(rois.scalar_type() == feature_dtype || float32_boxes_for_16bit, op, ": rois dtype ",
                   rois.scalar_type(), " does not match the features' dtype ", feature_dtype,
                   " (float32 rois are also accepted with float16/bfloat16 features)");
  TORCH_CHECK(rois.device() == device, op, ": rois is on ", rois.device(), " but the features are on ", device);
}

void check_roi_levels(const char* op, const at::Tensor& roi_levels, const at::Tensor& rois, at::Device device) {
  if (!roi_levels.defined()) return;
  TORCH_CHECK_VALUE(roi_levels.dim() == 1 && roi_levels.size(0) == rois.size(0), op,
                    ": roi_levels must be (K,) with K = ", text(rois.size(0)), ", got shape ",
                    text(roi_levels.sizes()));
  TORCH_CHECK_TYPE(roi_levels.scalar_type() == at::kLong, op, ": roi_levels must be int64, got ",
                   roi_levels.scalar_type());
  TORCH_CHECK(roi_levels.device() == device, op, ": roi_levels is on ", roi_levels.device(),
              " but the features are on ", device);
}

void check_spatial_scales(const char* op, at::ArrayRef<double> spatial_scales, size_t num_levels) {
  TORCH_CHECK_VALUE(spatial_scales.size() == num_levels, op, ": got ", text(spatial_scales.size()),
                    " spatial scales for ", text(num_levels), " feature levels");
  for (const double scale : spatial_scales)
    TORCH_CHECK_VALUE(std::isfinite(scale) && scale > 0, op, ": spatial_scale must be positive, got ", text(scale));
}

}  // namespace

void check_batch_index_range(const char* op, double lowest, double highest, int64_t batch) {
  TORCH_CHECK_INDEX(lowest >= 0 && highest < static_cast<double>(batch), op,
                    ": rois[:, 0] must hold batch indices in [0, ", text(batch), "), got values in [", text(lowest),
                    ", ", text(highest), "]");
}

CheckedArgs check_forward_args(const char* op, at::TensorList features, const at::Tensor& rois,
                               const at::Tensor& roi_levels, int64_t pooled_height, int64_t pooled_width,
                               at::ArrayRef<double> spatial_scales, int64_t sampling_ratio, bool aligned, bool max_mode,
                               bool check_batch_index_values) {
  TORCH_CHECK_VALUE(!features.empty() && features.size() <= static_cast<size_t>(kMaxLevels), op, ": expected 1 to ",
                    text(kMaxLevels), " feature maps, got ", text(features.size()));
  const at::Tensor& first = features[0];
  TORCH_CHECK_TYPE(supported_dtype(first.scalar_type()), op,
                   ": features must be float32, float16, bfloat16 or float64, got ", first.scalar_type());
  for (size_t level = 0; level < features.size(); ++level) {
    const at::Tensor& map = features[level];
    TORCH_CHECK_VALUE(map.dim() == 4, op, ": features must be (N, C, H, W), level ", text(level), " has shape ",
                      text(map.sizes()));
    TORCH_CHECK_VALUE(map.size(0) == first.size(0) && map.size(1) == first.size(1), op,
                      ": every level must have the same batch and channels, level ", text(level), " has shape ",
                      text(map.sizes()), " and level 0 ", text(first.sizes()));
    TORCH_CHECK_VALUE(map.size(2) > 0 && map.size(3) > 0, op, ": feature level ", text(level),
                      " is empty: ", text(map.sizes()));
    TORCH_CHECK_TYPE(map.scalar_type() == first.scalar_type(), op, ": feature level ", text(level), " is ",
                     map.scalar_type(), " but level 0 is ", first.scalar_type());
    TORCH_CHECK(map.device() == first.device(), op, ": feature level ", text(level), " is on ", map.device(),
                " but level 0 is on ", first.device());
  }
  check_spatial_scales(op, spatial_scales, features.size());
  check_rois(op, rois, first.scalar_type(), first.device());
  check_roi_levels(op, roi_levels, rois, first.device());
  const PoolParams params = pool_params(op, pooled_height, pooled_width, sampling_ratio, aligned, max_mode);
  if (check_batch_index_values && rois.size(0) > 0) {  // the CUDA launcher checks them itself, see there
    const auto [lowest, highest] = at::aminmax(rois.select(1, 0).to(at::kDouble));
    check_batch_index_range(op, lowest.item<double>(), highest.item<double>(), first.size(0));
  }
  return CheckedArgs{roi_levels.defined() ? roi_levels.contiguous() : roi_levels, params};
}

CheckedArgs check_backward_args(const char* op, const at::Tensor& grad_output, const at::Tensor& rois,
                                const at::Tensor& roi_levels, const at::Tensor& argmax, at::IntArrayRef feature_shapes,
                                at::ArrayRef<double> spatial_scales, int64_t sampling_ratio, bool aligned,
                                bool max_mode) {
  TORCH_CHECK_TYPE(supported_dtype(grad_output.scalar_type()), op,
                   ": grad_output must be float32, float16, bfloat16 or float64, got ", grad_output.scalar_type());
  const size_t num_levels = feature_shapes.size() / 4;
  TORCH_CHECK_VALUE(feature_shapes.size() % 4 == 0 && num_levels >= 1 && num_levels <= kMaxLevels, op,
                    ": feature shapes must be (N, C, H, W) for 1 to ", text(kMaxLevels), " levels, got ",
                    text(feature_shapes));
  for (size_t level = 0; level < num_levels; ++level) {
    const at::IntArrayRef shape = feature_shapes.slice(4 * level, 4);
    TORCH_CHECK_VALUE(shape[0] == feature_shapes[0] && shape[1] == feature_shapes[1] && shape[2] > 0 && shape[3] > 0,
                      op, ": feature level ", text(level), " has shape ", text(shape),
                      "; levels need the same batch and channels and non-empty maps");
  }
  check_spatial_scales(op, spatial_scales, num_levels);
  check_rois(op, rois, grad_output.scalar_type(), grad_output.device());
  check_roi_levels(op, roi_levels, rois, grad_output.device());
  TORCH_CHECK_VALUE(
      grad_output.dim() == 4 && grad_output.size(0) == rois.size(0) && grad_output.size(1) == feature_shapes[1], op,
      ": grad_output must be (K, C, PH, PW) with K = ", text(rois.size(0)), " and C = ", text(feature_shapes[1]),
      ", got ", text(grad_output.sizes()));
  const PoolParams params =
      pool_params(op, grad_output.size(2), grad_output.size(3), sampling_ratio, aligned, max_mode);
  if (max_mode) {
    TORCH_CHECK_VALUE(argmax.sizes() == grad_output.sizes(), op, ": argmax must have grad_output's shape ",
                      text(grad_output.sizes()), ", got ", text(argmax.sizes()));
    TORCH_CHECK_TYPE(argmax.scalar_type() == at::kInt, op, ": argmax must be int32, got ", argmax.scalar_type());
    TORCH_CHECK(argmax.device() == grad_output.device(), op, ": argmax is on ", argmax.device(),
                " but grad_output is on ", grad_output.device());
  }
  return CheckedArgs{roi_levels.defined() ? roi_levels.contiguous() : roi_levels, params};
}

}  // namespace roi_align
}  // namespace yolo_fastdetect
