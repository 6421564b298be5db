// RoIAlign: per-sample math shared by the CPU and CUDA kernels, for one or several feature levels.
//
// Semantics are mmcv's / torchvision's: a RoI [batch_index, x1, y1, x2, y2] in input pixels is scaled by the
// level's spatial_scale (and shifted by half a pixel when `aligned`), split into pooled_height x pooled_width
// bins, and each bin samples a grid_h x grid_w grid of points (sampling_ratio, or ceil(bin size) when <= 0),
// each read by bilinear interpolation (zero outside the map). "avg" averages the samples; "max" keeps the
// largest and remembers which sample (index iy * grid_w + ix) for the backward pass.
//
// The single-level operator is the multi-level one with one level: every kernel reads features through a
// LevelTable and each RoI's level from an optional per-RoI level table.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <ATen/core/Tensor.h>

#include "../common.h"

namespace yolo_fastdetect {
namespace roi_align {

// Kernel parameters are passed by value, so the level table has a fixed capacity.
constexpr int kMaxLevels = 8;
// Cap on the adaptive sampling grid (points per bin side). Only a bin wider than this many feature pixels
// reaches it; it keeps a garbage RoI (1e30 wide) from looping for hours. NaN or negative sizes give 0 samples.
constexpr int kMaxAdaptiveGrid = 256;

// Maps of every level, addressed through their strides (any memory format); levels share batch and channels.
// element_t is `const scalar_t` for the features read by the forward pass and the accumulation type for the
// gradient buffers written by the backward pass.
template <typename element_t>
struct LevelTable {
  int num_levels;
  int64_t batch;
  int64_t channels;
  element_t* data[kMaxLevels];
  int64_t height[kMaxLevels];
  int64_t width[kMaxLevels];
  int64_t stride_n[kMaxLevels], stride_c[kMaxLevels], stride_h[kMaxLevels], stride_w[kMaxLevels];
  double spatial_scale[kMaxLevels];
};

// Pooling parameters common to every RoI.
struct PoolParams {
  int64_t pooled_height;
  int64_t pooled_width;
  int64_t sampling_ratio;
  bool aligned;
  bool max_mode;
};

// One RoI mapped onto its level: the top-left corner of bin (0, 0), the bin size and the sampling grid.
template <typename acc_t>
struct RoiBins {
  acc_t start_y, start_x;
  acc_t bin_height, bin_width;
  int grid_h, grid_w;
};

YFD_HOST_DEVICE int adaptive_grid(double extent_per_bin) {
  const double points = ceil(extent_per_bin);
  // Written so that NaN fails the first comparison.
  return points > 0 ? (points < kMaxAdaptiveGrid ? static_cast<int>(points) : kMaxAdaptiveGrid) : 0;
}

// roi points at [batch_index, x1, y1, x2, y2]. Operation order follows torchvision so float results agree; no FMA
// contraction (see mul_rounded), so the CPU and CUDA kernels sample the same points.
template <typename acc_t>
YFD_HOST_DEVICE RoiBins<acc_t> roi_bins(const acc_t* roi, acc_t spatial_scale, const PoolParams& params) {
  const acc_t offset = params.aligned ? acc_t(0.5) : acc_t(0);
  RoiBins<acc_t> bins;
  bins.start_x = add_rounded(mul_rounded(roi[1], spatial_scale), -offset);
  bins.start_y = add_rounded(mul_rounded(roi[2], spatial_scale), -offset);
  acc_t roi_width = add_rounded(add_rounded(mul_rounded(roi[3], spatial_scale), -offset), -bins.start_x);
  acc_t roi_height = add_rounded(add_rounded(mul_rounded(roi[4], spatial_scale), -offset), -bins.start_y);
  if (!params.aligned) {  // the legacy (Detectron v1) convention: RoIs at least one pixel wide
    roi_width = roi_width > acc_t(1) ? roi_width : acc_t(1);
    roi_height = roi_height > acc_t(1) ? roi_height : acc_t(1);
  }
  bins.bin_height = roi_height / static_cast<acc_t>(params.pooled_height);
  bins.bin_width = roi_width / static_cast<acc_t>(params.pooled_width);
  if (params.sampling_ratio > 0) {
    bins.grid_h = bins.grid_w = static_cast<int>(params.sampling_ratio);
  } else {
    bins.grid_h = adaptive_grid(static_cast<double>(roi_height / static_cast<acc_t>(params.pooled_height)));
    bins.grid_w = adaptive_grid(static_cast<double>(roi_width / static_cast<acc_t>(params.pooled_width)));
  }
  return bins;
}

// Coordinate of sample `i` (of `grid`) inside bin `bin` along one axis.
template <typename acc_t>
YFD_HOST_DEVICE acc_t sample_coordinate(acc_t start, acc_t bin_size, int64_t bin, int i, int grid) {
  const acc_t bin_start = add_rounded(start, mul_rounded(static_cast<acc_t>(bin), bin_size));
  return add_rounded(bin_start, mul_rounded(static_cast<acc_t>(i + acc_t(0.5)), bin_size) / static_cast<acc_t>(grid));
}

// Bilinear interpolation along one axis: the element offsets (index * stride) of the two neighbouring rows (or
// columns) and their weights.
template <typename acc_t>
struct AxisTaps {
  bool valid;  // false when the point lies more than one pixel outside the map: the sample reads 0
  int64_t low, high;
  acc_t weight_low, weight_high;
};

template <typename acc_t>
YFD_HOST_DEVICE AxisTaps<acc_t> axis_taps(acc_t coordinate, int64_t size, int64_t stride) {
  AxisTaps<acc_t> taps;
  // Written so that NaN is invalid.
  taps.valid = coordinate >= acc_t(-1) && coordinate <= static_cast<acc_t>(size);
  if (!taps.valid) {
    taps.low = taps.high = 0;
    taps.weight_low = taps.weight_high = acc_t(0);
    return taps;
  }
  if (coordinate <= acc_t(0)) coordinate = acc_t(0);
  int64_t low = static_cast<int64_t>(coordinate), high;
  if (low >= size - 1) {
    low = high = size - 1;
    coordinate = static_cast<acc_t>(low);
  } else {
    high = low + 1;
  }
  const acc_t fraction = coordinate - static_cast<acc_t>(low);
  taps.low = low * stride;
  taps.high = high * stride;
  taps.weight_low = acc_t(1) - fraction;
  taps.weight_high = fraction;
  return taps;
}

// The four taps of a sample point: element offsets inside one channel plane and bilinear weights. The CUDA kernels
// also build them with 32-bit offsets from their shared-memory tables.
template <typename acc_t, typename offset_t = int64_t>
struct PointTaps {
  bool valid;
  offset_t offset[4];  // (low y, low x), (low y, high x), (high y, low x), (high y, high x)
  acc_t weight[4];
};

// The taps of point (y, x) from its axis taps: AxisTaps, or any type with the same low / high / weight_low /
// weight_high members (the CUDA kernels' tables).
template <typename offset_t, typename acc_t, typename Axis>
YFD_HOST_DEVICE PointTaps<acc_t, offset_t> combine_taps(const Axis& y, const Axis& x, bool valid) {
  PointTaps<acc_t, offset_t> taps;
  taps.valid = valid;
  taps.offset[0] = y.low + x.low;
  taps.offset[1] = y.low + x.high;
  taps.offset[2] = y.high + x.low;
  taps.offset[3] = y.high + x.high;
  taps.weight[0] = y.weight_low * x.weight_low;
  taps.weight[1] = y.weight_low * x.weight_high;
  taps.weight[2] = y.weight_high * x.weight_low;
  taps.weight[3] = y.weight_high * x.weight_high;
  return taps;
}

template <typename acc_t>
YFD_HOST_DEVICE PointTaps<acc_t> point_taps(const AxisTaps<acc_t>& y, const AxisTaps<acc_t>& x) {
  return combine_taps<int64_t, acc_t>(y, x, y.valid && x.valid);
}

template <typename acc_t, typename scalar_t>
YFD_HOST_DEVICE acc_t interpolate(const scalar_t* plane, const PointTaps<acc_t>& taps) {
  if (!taps.valid) return acc_t(0);
  return taps.weight[0] * static_cast<acc_t>(plane[taps.offset[0]]) +
         taps.weight[1] * static_cast<acc_t>(plane[taps.offset[1]]) +
         taps.weight[2] * static_cast<acc_t>(plane[taps.offset[2]]) +
         taps.weight[3] * static_cast<acc_t>(plane[taps.offset[3]]);
}

// Level and batch image of RoI `k`, or false when either is out of range (the RoI then pools zeros and
// receives no gradient). Kernels call this before touching any feature memory, so a bad index never reads out
// of bounds even when the host-side validation was skipped (CUDA graph capture, a direct operator call).
template <typename acc_t, typename element_t>
YFD_HOST_DEVICE bool roi_source(const acc_t* roi, const int64_t* roi_levels, int64_t k,
                                const LevelTable<element_t>& levels, int& level, int64_t& batch_index) {
  const int64_t chosen = roi_levels == nullptr ? 0 : roi_levels[k];
  if (chosen < 0 || chosen >= levels.num_levels) return false;
  const acc_t index = roi[0];
  if (!(index >= acc_t(0) && index < static_cast<acc_t>(levels.batch))) return false;  // NaN too
  level = static_cast<int>(chosen);
  batch_index = static_cast<int64_t>(index);
  return true;
}

// float64 features accumulate in float64, everything else in float32 (at::opmath_type, as a runtime dtype).
inline at::ScalarType accumulation_dtype(at::ScalarType dtype) {
  return dtype == at::kDouble ? at::kDouble : at::kFloat;
}

// Host-side checks shared by both launchers, defined in roi_align.cpp.

// Raises unless the lowest and highest batch index of the rois lie in [0, batch) (NaN fails).
void check_batch_index_range(const char* op, double lowest, double highest, int64_t batch);

// The checks of every argument of the forward and backward operators. They raise errors that name the
// argument and return the pooling parameters with roi_levels made contiguous (undefined for a single level).
// Batch indices are checked here only when `check_batch_index_values` (the CUDA launcher checks them itself,
// without stalling the GPU).
struct CheckedArgs {
  at::Tensor roi_levels;  // (K,) int64 or undefined
  PoolParams params;
};

CheckedArgs check_forward_args(const char* op, at::TensorList features, const at::Tensor& rois,
                               const at::Tensor& roi_levels, int64_t pooled_height, int64_t pooled_width,
                               at::ArrayRef<double> spatial_scales, int64_t sampling_ratio, bool aligned, bool max_mode,
                               bool check_batch_index_values);

CheckedArgs check_backward_args(const char* op, const at::Tensor& grad_output, const at::Tensor& rois,
                                const at::Tensor& roi_levels, const at::Tensor& argmax, at::IntArrayRef feature_shapes,
                                at::ArrayRef<double> spatial_scales, int64_t sampling_ratio, bool aligned,
                                bool max_mode);

// Fills the level table for maps of any strides (the caller keeps `maps` alive).
template <typename element_t>
LevelTable<element_t> level_table(at::TensorList maps, at::ArrayRef<double> spatial_scales) {
  LevelTable<element_t> levels;
  levels.num_levels = static_cast<int>(maps.size());
  levels.batch = maps[0].size(0);
  levels.channels = maps[0].size(1);
  for (int level = 0; level < levels.num_levels; ++level) {
    const at::Tensor& map = maps[level];
    levels.data[level] = map.data_ptr<std::remove_const_t<element_t>>();
    levels.height[level] = map.size(2);
    levels.width[level] = map.size(3);
    levels.stride_n[level] = map.stride(0);
    levels.stride_c[level] = map.stride(1);
    levels.stride_h[level] = map.stride(2);
    levels.stride_w[level] = map.stride(3);
    levels.spatial_scale[level] = spatial_scales[level];
  }
  return levels;
}

}  // namespace roi_align
}  // namespace yolo_fastdetect
