// RoIAlign on the GPU: how a block samples its RoI. The taps of the RoI's samples are tabulated once in shared memory
// (or computed where they are used), and the sample loops of a bin read them back: the mean of a bin (avg mode) or
// its largest sample (max mode) for a lane's packet of channels. The kernels are in roi_align_cuda.cu.
#pragma once

#include <cuda/std/limits>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../common/cuda_primitives.cuh"
#include "roi_align.h"

namespace yolo_fastdetect {
namespace roi_align {

// One level's map as the kernels address it.
struct PlaneShape {
  int64_t height, width, stride_h, stride_w;
};

template <typename element_t>
__device__ __forceinline__ PlaneShape plane_shape(const LevelTable<element_t>& levels, int level) {
  return {levels.height[level], levels.width[level], levels.stride_h[level], levels.stride_w[level]};
}

// A RoI's sampling grid on its level, with its taps tabulated once per block in shared memory (32-bit offsets):
//  - max mode needs each sample's value: the axis taps of every sample (bin * grid + i along each axis);
//  - avg mode sums the samples of a bin, so their taps are merged per axis: a bin's rows (and columns) are the
//    distinct rows its samples read, each with the summed weight of those reads, and the bin's sum is that of
//    weight_y(row) * weight_x(column) * pixel(row, column). A bin of a pixel or two reads each of its 2 or 3 rows
//    once rather than once per sample: typically 9 loads instead of 16 for 2 x 2 samples. A sample outside the map
//    adds no tap.
// A grid too large for the tables (a large sampling_ratio, or the adaptive grid of a huge RoI), or a map whose plane
// offsets need 64 bits, computes the taps of each sample where it is used instead. The choice is made once per block
// (with_tabulation), not per sample.
constexpr int kTapTable = 128;  // samples per axis (pooled size * grid) that the tables hold

// Whether a block tabulates its RoI's taps: the launcher allows it (tap_tables: every map's plane offsets fit in 32
// bits) and the tables hold a pooled_height x pooled_width output sampled grid_h x grid_w times per bin. The launcher
// asks it of a fixed sampling_ratio (then every block tabulates: Tiling::all_tabulated), each block of its RoI's grid.
template <typename Int>
YFD_HOST_DEVICE bool tabulates(bool tap_tables, Int pooled_height, Int pooled_width, Int grid_h, Int grid_w) {
  return tap_tables && pooled_height * grid_h <= kTapTable && pooled_width * grid_w <= kTapTable;
}

// A sample's axis taps as the max-mode tables hold them: element offsets inside the plane and weights. A point
// outside the map has weights 0 and offsets 0 (so that it can be read without a branch); inside, weight_low =
// 1 - fraction > 0.
template <typename acc_t>
struct TableTaps {
  int32_t low, high;
  acc_t weight_low, weight_high;
};

// One merged tap of a bin along one axis (avg mode): a row (or column) offset and the summed weight of its reads.
template <typename acc_t>
struct BinTap {
  int32_t offset;
  acc_t weight;
};

// Avg-mode tables: per axis 2 * kTapTable taps (a bin's taps start at bin * 2 * grid), then the tap counts per bin.
template <typename acc_t>
constexpr int64_t kBinTapTableBytes = 2 * 2 * kTapTable * sizeof(BinTap<acc_t>) + 2 * kTapTable * sizeof(int32_t);
template <typename acc_t>
constexpr int64_t kTapTableBytes =
    std::max<int64_t>(2 * kTapTable * sizeof(TableTaps<acc_t>), kBinTapTableBytes<acc_t>);
static_assert(kTapTableBytes<float> % 16 == 0 && kTapTableBytes<double> % 16 == 0, "the tiles follow the tables");

template <typename acc_t>
__device__ __forceinline__ TableTaps<acc_t> table_taps(const AxisTaps<acc_t>& taps) {
  if (!taps.valid) return {0, 0, acc_t(0), acc_t(0)};
  return {static_cast<int32_t>(taps.low), static_cast<int32_t>(taps.high), taps.weight_low, taps.weight_high};
}

// point_taps() of roi_align.h for table entries: 32-bit offsets, valid unless either axis is outside the map.
template <typename acc_t>
__device__ __forceinline__ PointTaps<acc_t, int32_t> point_taps(const TableTaps<acc_t>& y, const TableTaps<acc_t>& x) {
  return combine_taps<int32_t, acc_t>(y, x, y.weight_low > acc_t(0) && x.weight_low > acc_t(0));
}

// Writes the merged taps of the `grid` samples that sample(i) gives along one axis of a bin to `taps`, in order, and
// returns their number (at most 2 * grid).
template <typename acc_t, typename Sample>
__device__ __forceinline__ int32_t merge_bin_taps(int grid, Sample sample, BinTap<acc_t>* taps) {
  int32_t count = 0;
  const auto add = [&](int64_t offset, acc_t weight) {
    // Sample coordinates grow with i and a sample's high tap is its low one or the next, so a repeated offset is
    // one of the last two taps.
    for (int32_t j = count - 1; j >= 0 && j >= count - 2; --j) {
      if (taps[j].offset == offset) {
        taps[j].weight += weight;
        return;
      }
    }
    taps[count++] = {static_cast<int32_t>(offset), weight};
  };
  for (int i = 0; i < grid; ++i) {
    const AxisTaps<acc_t> axis = sample(i);
    if (!axis.valid) continue;
    add(axis.low, axis.weight_low);
    add(axis.high, axis.weight_high);
  }
  return count;
}

template <typename acc_t>
struct SampleGrid {
  RoiBins<acc_t> bins;
  PlaneShape plane;
  const void* tables;  // the max-mode or avg-mode tables; null when not tabulated

  __device__ __forceinline__ AxisTaps<acc_t> compute_y(int ph, int iy) const {
    return axis_taps(sample_coordinate(bins.start_y, bins.bin_height, ph, iy, bins.grid_h), plane.height,
                     plane.stride_h);
  }

  __device__ __forceinline__ AxisTaps<acc_t> compute_x(int pw, int ix) const {
    return axis_taps(sample_coordinate(bins.start_x, bins.bin_width, pw, ix, bins.grid_w), plane.width, plane.stride_w);
  }

  // Max mode: a sample's axis taps.
  template <bool kTabulated>
  __device__ __forceinline__ auto y_taps(int ph, int iy) const {
    if constexpr (kTabulated) return static_cast<const TableTaps<acc_t>*>(tables)[ph * bins.grid_h + iy];
    else return compute_y(ph, iy);
  }

  template <bool kTabulated>
  __device__ __forceinline__ auto x_taps(int pw, int ix) const {
    if constexpr (kTabulated) return static_cast<const TableTaps<acc_t>*>(tables)[kTapTable + pw * bins.grid_w + ix];
    else return compute_x(pw, ix);
  }

  // Avg mode: the merged taps of a bin's row ph (axis 0) or column pw (axis 1), and their number.
  __device__ __forceinline__ const BinTap<acc_t>* bin_taps(int axis, int bin) const {
    const int grid = axis == 0 ? bins.grid_h : bins.grid_w;
    return static_cast<const BinTap<acc_t>*>(tables) + axis * 2 * kTapTable + bin * 2 * grid;
  }

  __device__ __forceinline__ int32_t bin_tap_count(int axis, int bin) const {
    const auto* counts = reinterpret_cast<const int32_t*>(static_cast<const BinTap<acc_t>*>(tables) + 4 * kTapTable);
    return counts[axis * kTapTable + bin];
  }
};

// Fills the block's tables (of max mode or avg mode) when the grid fits them and the launcher allows 32-bit offsets
// (tap_tables: Tiling::tap_tables). Every thread of the block must call it (it synchronises).
template <bool kMaxMode, typename acc_t>
__device__ __forceinline__ SampleGrid<acc_t> sample_grid(const RoiBins<acc_t>& bins, const PlaneShape& plane,
                                                         const PoolParams& params, bool tap_tables, void* tables) {
  SampleGrid<acc_t> grid{bins, plane, nullptr};
  const int pooled_height = static_cast<int>(params.pooled_height);
  const int pooled_width = static_cast<int>(params.pooled_width);
  if (tabulates(tap_tables, pooled_height, pooled_width, bins.grid_h, bins.grid_w)) {
    if constexpr (kMaxMode) {
      TableTaps<acc_t>* taps = static_cast<TableTaps<acc_t>*>(tables);
      for (int i = threadIdx.x; i < pooled_height * bins.grid_h; i += blockDim.x)
        taps[i] = table_taps(grid.compute_y(i / bins.grid_h, i % bins.grid_h));
      for (int i = threadIdx.x; i < pooled_width * bins.grid_w; i += blockDim.x)
        taps[kTapTable + i] = table_taps(grid.compute_x(i / bins.grid_w, i % bins.grid_w));
    } else {  // a thread per bin row or column
      BinTap<acc_t>* taps = static_cast<BinTap<acc_t>*>(tables);
      int32_t* counts = reinterpret_cast<int32_t*>(taps + 4 * kTapTable);
      for (int i = threadIdx.x; i < pooled_height + pooled_width; i += blockDim.x) {
        if (i < pooled_height) {
          counts[i] = merge_bin_taps<acc_t>(
              bins.grid_h, [&](int iy) { return grid.compute_y(i, iy); }, taps + i * 2 * bins.grid_h);
        } else {
          const int pw = i - pooled_height;
          counts[kTapTable + pw] = merge_bin_taps<acc_t>(
              bins.grid_w, [&](int ix) { return grid.compute_x(pw, ix); }, taps + 2 * kTapTable + pw * 2 * bins.grid_w);
        }
      }
    }
    grid.tables = tables;
  }
  __syncthreads();
  return grid;
}

// Calls pool(std::true_type()) when the grid is tabulated, pool(std::false_type()) otherwise, so that each sample
// loop is compiled for one source of taps. kAllTabulated (tiling.all_tabulated, known on the host) compiles only the
// first: the computed taps' registers (80 instead of 64 for float32) would otherwise count for every block.
template <bool kAllTabulated, typename acc_t, typename Pool>
__device__ __forceinline__ void with_tabulation(const SampleGrid<acc_t>& grid, Pool pool) {
  if (kAllTabulated || grid.tables != nullptr) pool(std::true_type());
  else pool(std::false_type());
}

// Calls visit(sample, taps) for every sample of bin (ph, pw), in the order iy * grid_w + ix that argmax holds:
// from the max-mode tables (kTabulated) or computed.
template <bool kTabulated, typename acc_t, typename Visit>
__device__ __forceinline__ void for_each_sample(const SampleGrid<acc_t>& grid, int ph, int pw, Visit visit) {
  for (int iy = 0; iy < grid.bins.grid_h; ++iy) {
    const auto y = grid.template y_taps<kTabulated>(ph, iy);
    // Two samples per round: their loads are in flight together.
#pragma unroll 2
    for (int ix = 0; ix < grid.bins.grid_w; ++ix)
      visit(iy * grid.bins.grid_w + ix, point_taps(y, grid.template x_taps<kTabulated>(pw, ix)));
  }
}

// Calls visit(offset, weight) for every merged tap of bin (ph, pw) in the avg-mode tables: offset = row offset +
// column offset, weight = weight_y * weight_x. Columns go four at a time under predicates and rows two at a time,
// so that up to eight loads of the visitor are in flight together.
template <typename acc_t, typename Visit>
__device__ __forceinline__ void for_each_bin_tap(const SampleGrid<acc_t>& grid, int ph, int pw, Visit visit) {
  const BinTap<acc_t>* rows = grid.bin_taps(0, ph);
  const BinTap<acc_t>* columns = grid.bin_taps(1, pw);
  const int32_t num_rows = grid.bin_tap_count(0, ph), num_columns = grid.bin_tap_count(1, pw);
  for (int32_t first_column = 0; first_column < num_columns; first_column += 4) {
    BinTap<acc_t> column[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) column[k] = columns[min(first_column + k, num_columns - 1)];
#pragma unroll 2
    for (int32_t r = 0; r < num_rows; ++r) {
      const BinTap<acc_t> row = rows[r];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (first_column + k < num_columns) visit(row.offset + column[k].offset, row.weight * column[k].weight);
    }
  }
}

// values[v] / count for every v. Dividing by a power of two equals multiplying by its inverse, exactly and for less
// than the cost of a division (the common sampling_ratio 2 gives 4 samples).
template <int V, typename acc_t>
__device__ __forceinline__ void divide_by_count(acc_t (&values)[V], int count) {
  if ((count & (count - 1)) == 0) {
    const acc_t inverse = acc_t(1) / static_cast<acc_t>(count);
#pragma unroll
    for (int v = 0; v < V; ++v) values[v] *= inverse;
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) values[v] /= static_cast<acc_t>(count);
  }
}

// The sample's bilinear value for the lane's V channels, summed in interpolate()'s order; 0 outside the map. Read
// without a branch (outside, the taps are offsets 0, in bounds, and the value is then replaced by a select), so that
// the loads of consecutive samples can be in flight together.
template <int V, typename scalar_t, typename acc_t, typename offset_t>
__device__ __forceinline__ void interpolate_packet(const scalar_t* lane_image, const PointTaps<acc_t, offset_t>& taps,
                                                   acc_t (&value)[V]) {
#pragma unroll
  for (int tap = 0; tap < 4; ++tap) {
    const Packet<scalar_t, V> packet = load_packet<scalar_t, V>(lane_image + taps.offset[tap]);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const acc_t term = taps.weight[tap] * static_cast<acc_t>(packet.value[v]);
      value[v] = tap == 0 ? term : value[v] + term;
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v) value[v] = taps.valid ? value[v] : acc_t(0);
}

// Avg mode: the mean of bin (ph, pw)'s samples for the lane's V channels, from the merged taps (kTabulated) or
// sample by sample.
template <bool kTabulated, int V, typename scalar_t, typename acc_t>
__device__ __forceinline__ void average_bin(const SampleGrid<acc_t>& grid, int ph, int pw, const scalar_t* lane_image,
                                            acc_t (&sum)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) sum[v] = acc_t(0);
  if constexpr (kTabulated) {
    for_each_bin_tap(grid, ph, pw, [&](int32_t offset, acc_t weight) {
      const Packet<scalar_t, V> packet = load_packet<scalar_t, V>(lane_image + offset);
#pragma unroll
      for (int v = 0; v < V; ++v) sum[v] += weight * static_cast<acc_t>(packet.value[v]);
    });
  } else {
    acc_t value[V];
    for_each_sample<false>(grid, ph, pw, [&](int, const auto& taps) {
      interpolate_packet<V>(lane_image, taps, value);
#pragma unroll
      for (int v = 0; v < V; ++v) sum[v] += value[v];
    });
  }
  divide_by_count<V>(sum, max(grid.bins.grid_h * grid.bins.grid_w, 1));
}

// Max mode: per channel, the largest sample of bin (ph, pw) and its index iy * grid_w + ix; 0 and -1 for a bin
// without samples (or with NaN ones only).
template <bool kTabulated, int V, typename scalar_t, typename acc_t>
__device__ __forceinline__ void max_of_bin(const SampleGrid<acc_t>& grid, int ph, int pw, const scalar_t* lane_image,
                                           acc_t (&best)[V], int32_t (&best_sample)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
    best[v] = -::cuda::std::numeric_limits<acc_t>::infinity();
    best_sample[v] = -1;
  }
  acc_t value[V];
  for_each_sample<kTabulated>(grid, ph, pw, [&](int sample, const auto& taps) {
    interpolate_packet<V>(lane_image, taps, value);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (value[v] > best[v]) {
        best[v] = value[v];
        best_sample[v] = sample;
      }
    }
  });
#pragma unroll
  for (int v = 0; v < V; ++v) best[v] = best_sample[v] >= 0 ? best[v] : acc_t(0);
}

}  // namespace roi_align
}  // namespace yolo_fastdetect
