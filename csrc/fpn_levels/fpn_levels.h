// FPN level of each RoI (Lin et al. 2017, eq. 1, as torchvision's LevelMapper): per-RoI math shared by the CPU and
// CUDA kernels.
//
// torchvision: level = clamp(floor(k0 + log2(sqrt(area) / s0) + eps), lowest, highest) - lowest. The same level
// without log2 or sqrt, so that both devices agree bit for bit: level >= n exactly when
// area >= s0^2 * 2^(2 * (n - k0 - eps)), so the level is the number of n in (lowest, highest] whose threshold the
// area reaches. The thresholds are computed once on the host in double; the area in double from the RoI's values.
#pragma once

#include <cstdint>
#include <type_traits>

#include <ATen/core/Tensor.h>

#include "../common.h"
#include "../roi_align/roi_align.h"

namespace yolo_fastdetect {

// Kernel parameters are passed by value, so the threshold table has a fixed capacity: as many levels as the
// multi-level RoIAlign pools from.
struct FpnThresholds {
  int num_levels;
  // min_area[i]: the smallest area that maps to level i or above, for i in [1, num_levels); min_area[0] is unused.
  double min_area[roi_align::kMaxLevels];
};

// Level index (0 = the lowest level) of the box [x1, y1, x2, y2]; -1 for a NaN or negative area (one side
// inverted), where torchvision's sqrt gives NaN and its level is undefined. A zero area maps to level 0.
YFD_HOST_DEVICE int64_t fpn_level(double x1, double y1, double x2, double y2, const FpnThresholds& thresholds) {
  const double area = mul_rounded(add_rounded(x2, -x1), add_rounded(y2, -y1));
  if (!(area >= 0.0)) return -1;
  int64_t level = 0;
  for (int i = 1; i < thresholds.num_levels; ++i) level += area >= thresholds.min_area[i] ? 1 : 0;
  return level;
}

// Element strides of rois (K, 5) and its number of rows.
struct FpnRoiLayout {
  int64_t count;
  int64_t row_stride;
  int64_t column_stride;
};

// A coordinate as double: float32 and float64 directly, float16 and bfloat16 through float.
template <typename scalar_t>
YFD_HOST_DEVICE double fpn_coordinate(scalar_t value) {
  if constexpr (std::is_same_v<scalar_t, double>) return value;
  else return static_cast<double>(static_cast<float>(value));
}

// Level of RoI k of rois (any strides): columns 1-4 are x1, y1, x2, y2.
template <typename scalar_t>
YFD_HOST_DEVICE int64_t roi_fpn_level(const scalar_t* rois, const FpnRoiLayout& layout, int64_t k,
                                      const FpnThresholds& thresholds) {
  const scalar_t* roi = rois + k * layout.row_stride;
  const int64_t step = layout.column_stride;
  return fpn_level(fpn_coordinate(roi[step]), fpn_coordinate(roi[2 * step]), fpn_coordinate(roi[3 * step]),
                   fpn_coordinate(roi[4 * step]), thresholds);
}

// Validates the operator's arguments (raising errors that name the argument) and builds the thresholds and the
// layout of rois. Defined in fpn_levels_cpu.cpp, used by both launchers.
void check_fpn_levels_args(const at::Tensor& rois, int64_t lowest_level, int64_t num_levels, double canonical_size,
                           int64_t canonical_level, double eps, FpnThresholds& thresholds, FpnRoiLayout& layout);

}  // namespace yolo_fastdetect
