// RoIAlign on the GPU: forward and backward, one or several levels in one launch.
//
// Work split: a block owns one RoI, a chunk of its output bins and a chunk of channels. Its threads form groups of
// `group_size` lanes (up to a warp); a group pools one bin at a time and each lane owns a packet of V consecutive
// channels. On channels-last (NHWC) features a bilinear tap is then one V-wide vector load per lane (16 bytes),
// coalesced across the group. The sample geometry is the same for every channel: the block tabulates the taps of its
// RoI's samples once in shared memory (in avg mode merged per bin, so that a bin reads each pixel once) and every
// lane reads them back. The launcher hands the kernels NHWC features (converting NCHW ones with a tiled transpose)
// and accumulates gradients in an NHWC buffer, where the backward pass adds a packet with vector atomics (float4 on
// sm_90). The (K, C, PH, PW) output is staged through shared memory so that each block writes (and, backward, reads)
// whole runs of consecutive bins. What is touched once (the NCHW map the transpose reads, the pooled output) is marked
// evict-first, so that the L2 cache keeps the NHWC map that the pooling kernel reads.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda/std/limits>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "roi_align.h"

namespace yolo_fastdetect {
namespace roi_align {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kWarpSize = 32;
// Shared memory for one block's output tile; above 48 KiB a kernel must opt in, which the launcher does.
constexpr int64_t kMaxTileBytes = 80 * 1024;

// V elements loaded or stored as one aligned vector.
template <typename T, int V>
struct alignas(sizeof(T) * V) Packet {
  T value[V];
};

// How a launch splits the work; the same for the forward and the backward pass of one call.
struct Tiling {
  int threads;             // per block: groups of group_size lanes, a multiple of the warp size
  int group_size;          // lanes pooling one bin together, one packet of V channels each (a power of two <= 32)
  int64_t chunk_channels;  // channels per block: group_size * V
  int64_t channel_chunks;
  int64_t bins_per_block;
  int64_t bin_chunks;
  // The tile keeps a lane's V channel rows (bins_per_block elements each) together; lanes start lane_pitch elements
  // apart, V * bins_per_block rounded up to odd, so that the lanes of a group store into distinct banks.
  int64_t lane_pitch;
  // Dynamic shared memory: the tap tables, the value tile (rounded up to 16 bytes) and, in max mode, the int32
  // argmax tile, in that order.
  int64_t table_bytes;
  int64_t value_bytes;
  int64_t shared_bytes;
  int64_t blocks;
  bool tap_tables;     // whether tap tables may be used: every map's plane offsets fit in 32 bits
  bool all_tabulated;  // whether every block's grid fits the tables (a fixed sampling_ratio small enough)
};

// Whether every map's (H, W) plane is addressed by 32-bit element offsets, as the tap tables hold them.
bool plane_offsets_fit_int32(at::TensorList maps) {
  for (const at::Tensor& map : maps) {
    if ((map.size(2) - 1) * map.stride(2) + (map.size(3) - 1) * map.stride(3) >= std::numeric_limits<int32_t>::max())
      return false;
  }
  return true;
}

// maps: the NHWC maps the kernels address; vector_width: V; value_size: the bytes of a tile element (the output or
// grad_output dtype); table_bytes: the bytes of the tap tables, which hold kTapTable entries per axis.
Tiling make_tiling(at::TensorList maps, int64_t num_rois, int64_t channels, const PoolParams& params,
                   int vector_width, int64_t value_size, int64_t table_bytes, int64_t table_entries) {
  Tiling tiling;
  tiling.tap_tables = plane_offsets_fit_int32(maps);
  tiling.all_tabulated = tiling.tap_tables && params.sampling_ratio > 0 &&
                         params.pooled_height * params.sampling_ratio <= table_entries &&
                         params.pooled_width * params.sampling_ratio <= table_entries;
  const int64_t num_bins = params.pooled_height * params.pooled_width;
  const bool max_mode = params.max_mode;
  const int64_t packets = (channels + vector_width - 1) / vector_width;
  tiling.group_size = 1;
  while (tiling.group_size < kWarpSize && tiling.group_size < packets) tiling.group_size *= 2;
  tiling.chunk_channels = int64_t{tiling.group_size} * vector_width;
  tiling.channel_chunks = (channels + tiling.chunk_channels - 1) / tiling.chunk_channels;
  const int64_t bytes_per_bin = tiling.chunk_channels * (value_size + (max_mode ? 4 : 0));
  const int64_t max_bins = std::max<int64_t>(kMaxTileBytes / bytes_per_bin - 1, 1);  // -1: the lane padding
  tiling.bin_chunks = (num_bins + max_bins - 1) / max_bins;
  tiling.bins_per_block = (num_bins + tiling.bin_chunks - 1) / tiling.bin_chunks;
  // As many groups as make the rounds over the bins even (49 bins: 25 groups twice, not 32 then 17).
  const int64_t max_groups = kMaxThreads / tiling.group_size;
  const int64_t rounds = (tiling.bins_per_block + max_groups - 1) / max_groups;
  const int64_t groups = (tiling.bins_per_block + rounds - 1) / rounds;
  tiling.threads = static_cast<int>((groups * tiling.group_size + kWarpSize - 1) / kWarpSize * kWarpSize);
  tiling.lane_pitch = (vector_width * tiling.bins_per_block) | 1;
  const int64_t tile_elements = tiling.group_size * tiling.lane_pitch;
  tiling.table_bytes = table_bytes;
  tiling.value_bytes = (tile_elements * value_size + 15) / 16 * 16;
  tiling.shared_bytes = table_bytes + tiling.value_bytes + (max_mode ? tile_elements * 4 : 0);
  tiling.blocks = num_rois * tiling.channel_chunks * tiling.bin_chunks;
  TORCH_CHECK(tiling.blocks < (int64_t{1} << 31), "roi_align: too many RoIs x channels x bins for one launch");
  return tiling;
}

// Element of channel row `row` (of the block's chunk), bin `b` (of the block's bins) in the tile.
template <int V>
__device__ __forceinline__ int tile_index(const Tiling& tiling, int row, int b) {
  return row / V * static_cast<int>(tiling.lane_pitch) + row % V * static_cast<int>(tiling.bins_per_block) + b;
}

// What a thread works on: block index -> (RoI, bin chunk, channel chunk), channel chunks fastest so neighbouring
// blocks share taps; thread index -> (group, lane). 32-bit arithmetic: the launcher keeps blocks, bins and channels
// below 2^31.
struct BlockWork {
  int64_t roi;
  int first_bin;
  int num_bins;  // bins of this chunk
  int64_t first_channel;
  int pooled_width;
  int total_bins;  // pooled_height * pooled_width
  int lane, group, num_groups;
};

__device__ __forceinline__ BlockWork block_work(const Tiling& tiling, const PoolParams& params) {
  const int block = blockIdx.x;
  const int channel_chunks = static_cast<int>(tiling.channel_chunks), bin_chunks = static_cast<int>(tiling.bin_chunks);
  const int bins_per_block = static_cast<int>(tiling.bins_per_block);
  BlockWork work;
  work.pooled_width = static_cast<int>(params.pooled_width);
  work.total_bins = static_cast<int>(params.pooled_height) * work.pooled_width;
  const int channel_chunk = block % channel_chunks;
  const int bin_chunk = block / channel_chunks % bin_chunks;
  work.roi = block / (channel_chunks * bin_chunks);
  work.first_bin = bin_chunk * bins_per_block;
  work.num_bins = min(bins_per_block, work.total_bins - work.first_bin);
  work.first_channel = int64_t{channel_chunk} * tiling.chunk_channels;
  work.lane = threadIdx.x % tiling.group_size;
  work.group = threadIdx.x / tiling.group_size;
  work.num_groups = blockDim.x / tiling.group_size;
  return work;
}

// The block's tiles in dynamic shared memory, after the tap tables: values (outputs, or gradients of the outputs)
// and, in max mode, argmax.
template <typename value_t>
struct BlockTiles {
  value_t* values;
  int32_t* argmax;

  __device__ __forceinline__ BlockTiles(unsigned char* shared_memory, const Tiling& tiling)
      : values(reinterpret_cast<value_t*>(shared_memory + tiling.table_bytes)),
        argmax(reinterpret_cast<int32_t*>(shared_memory + tiling.table_bytes + tiling.value_bytes)) {}
};

// (ph, pw) of bin `bin` of a row-major grid `width` bins wide, stepped `step` bins at a time without a division per
// step (an integer division costs some 25 instructions).
struct BinCursor {
  int ph, pw;
  int step_h, step_w, width;

  __device__ __forceinline__ BinCursor(int bin, int step, int width)
      : ph(bin / width), pw(bin % width), step_h(step / width), step_w(step % width), width(width) {}

  __device__ __forceinline__ void advance() {
    ph += step_h;
    pw += step_w;
    if (pw >= width) {
      pw -= width;
      ++ph;
    }
  }
};

// Calls visit(tile index, output index) for every element of the block's tile that exists in the (K, C, PH, PW)
// output: a warp per channel row, its lanes along the row's bins, i.e. consecutive output addresses.
template <int V, typename Visit>
__device__ __forceinline__ void for_each_tile_element(const BlockWork& work, const Tiling& tiling, int64_t channels,
                                                      Visit visit) {
  const int rows = static_cast<int>(min(tiling.chunk_channels, channels - work.first_channel));
  for (int row = threadIdx.x / kWarpSize; row < rows; row += blockDim.x / kWarpSize) {
    const int64_t first_index = (work.roi * channels + work.first_channel + row) * work.total_bins + work.first_bin;
    const int first_tile_index = tile_index<V>(tiling, row, 0);
    for (int b = threadIdx.x % kWarpSize; b < work.num_bins; b += kWarpSize)
      visit(first_tile_index + b, first_index + b);
  }
}

// The rois (K, 5) as the kernels read them: any strides, float32, float64, float16 or bfloat16; a block converts its
// RoI to the accumulation type when it loads it.
struct RoiRows {
  enum class Dtype : int32_t { kFloat, kDouble, kHalf, kBFloat16 };
  const void* data;
  int64_t stride_k, stride_j;
  Dtype dtype;
};

RoiRows roi_rows(const at::Tensor& rois) {  // check_rois admits these four dtypes only
  const at::ScalarType dtype = rois.scalar_type();
  const RoiRows::Dtype code = dtype == at::kFloat    ? RoiRows::Dtype::kFloat
                              : dtype == at::kDouble ? RoiRows::Dtype::kDouble
                              : dtype == at::kHalf   ? RoiRows::Dtype::kHalf
                                                     : RoiRows::Dtype::kBFloat16;
  return {rois.const_data_ptr(), rois.stride(0), rois.stride(1), code};
}

// roi = rois[k] in the accumulation type.
template <typename acc_t>
__device__ __forceinline__ void load_roi(const RoiRows& rois, int64_t k, acc_t (&roi)[5]) {
  const auto load = [&](auto typed_null) {
    const auto* row = static_cast<decltype(typed_null)>(rois.data) + k * rois.stride_k;
#pragma unroll
    for (int j = 0; j < 5; ++j) roi[j] = static_cast<acc_t>(row[j * rois.stride_j]);
  };
  switch (rois.dtype) {
    case RoiRows::Dtype::kFloat: return load(static_cast<const float*>(nullptr));
    case RoiRows::Dtype::kDouble: return load(static_cast<const double*>(nullptr));
    case RoiRows::Dtype::kHalf: return load(static_cast<const at::Half*>(nullptr));
    case RoiRows::Dtype::kBFloat16: return load(static_cast<const at::BFloat16*>(nullptr));
  }
}

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
    return axis_taps(sample_coordinate(bins.start_x, bins.bin_width, pw, ix, bins.grid_w), plane.width,
                     plane.stride_w);
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

// Fills the block's tables (of max mode or avg mode) when both axes fit and the launcher allows 32-bit offsets
// (tiling.tap_tables). Every thread of the block must call it (it synchronises).
template <bool kMaxMode, typename acc_t>
__device__ __forceinline__ SampleGrid<acc_t> sample_grid(const RoiBins<acc_t>& bins, const PlaneShape& plane,
                                                         const PoolParams& params, const Tiling& tiling,
                                                         void* tables) {
  SampleGrid<acc_t> grid{bins, plane, nullptr};
  const int pooled_height = static_cast<int>(params.pooled_height);
  const int pooled_width = static_cast<int>(params.pooled_width);
  if (tiling.tap_tables && pooled_height * bins.grid_h <= kTapTable && pooled_width * bins.grid_w <= kTapTable) {
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
          counts[i] = merge_bin_taps<acc_t>(bins.grid_h, [&](int iy) { return grid.compute_y(i, iy); },
                                            taps + i * 2 * bins.grid_h);
        } else {
          const int pw = i - pooled_height;
          counts[kTapTable + pw] = merge_bin_taps<acc_t>(bins.grid_w, [&](int ix) { return grid.compute_x(pw, ix); },
                                                         taps + 2 * kTapTable + pw * 2 * bins.grid_w);
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

// The packet at `address` (of a map the kernel only reads) in 16-byte or smaller pieces: through the read-only data
// path (ld.global.nc), or marked evict-first (ld.global.cs) for data read once.
template <typename T, int V, bool kEvictFirst = false>
__device__ __forceinline__ Packet<T, V> load_packet(const T* address) {
  const auto load = [](const auto* piece) {
    if constexpr (kEvictFirst) return __ldcs(piece);
    else return __ldg(piece);
  };
  Packet<T, V> packet;
  constexpr int kBytes = sizeof(packet);
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i)
      reinterpret_cast<uint4*>(&packet)[i] = load(reinterpret_cast<const uint4*>(address) + i);
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(&packet) = load(reinterpret_cast<const uint2*>(address));
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<unsigned int*>(&packet) = load(reinterpret_cast<const unsigned int*>(address));
  } else {
    static_assert(kBytes == 2, "packets of 2, 4, 8 or a multiple of 16 bytes");
    *reinterpret_cast<unsigned short*>(&packet) = load(reinterpret_cast<const unsigned short*>(address));
  }
  return packet;
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

// p, held by the compiler as one 64-bit register. A lane's base address (map + image + channel offsets) would
// otherwise be re-added to every tap's 32-bit offset in 64-bit arithmetic: four instructions per load instead of one.
template <typename T>
__device__ __forceinline__ T* opaque_pointer(T* p) {
  asm("" : "+l"(p));
  return p;
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

template <int V>
__device__ __forceinline__ void atomic_add_packet(float* address, const float (&values)[V]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (V % 4 == 0) {  // sm_90 adds a float4 in one instruction
#pragma unroll
    for (int v = 0; v < V; v += 4)
      atomicAdd(reinterpret_cast<float4*>(address + v),
                make_float4(values[v], values[v + 1], values[v + 2], values[v + 3]));
  } else
#endif
  {
#pragma unroll
    for (int v = 0; v < V; ++v) atomicAdd(address + v, values[v]);
  }
}

template <int V>
__device__ __forceinline__ void atomic_add_packet(double* address, const double (&values)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) atomicAdd(address + v, values[v]);
}

// An element's bits as one unsigned integer of its size, for the cache-hinted stores.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 2, unsigned short,
                                std::conditional_t<sizeof(T) == 4, unsigned int, unsigned long long>>;

// A store marked evict-first (st.global.cs): for data written once and not read again by this kernel, such as the
// pooled output (50 MB for the benchmark's float32 case), so that it does not push the maps out of the L2 cache.
template <typename T>
__device__ __forceinline__ void store_evict_first(T* address, T value) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "elements of 2, 4 or 8 bytes");
  Bits<T> bits;
  memcpy(&bits, &value, sizeof(T));
  __stcs(reinterpret_cast<Bits<T>*>(address), bits);
}

// Waits until the kernel that this one was launched as a programmatic dependent of has finished and its writes are
// visible; returns at once after a plain launch.
__device__ __forceinline__ void wait_for_preceding_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the grid launched as this one's programmatic dependent start before this one exits; no-op otherwise.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

template <typename scalar_t, typename acc_t, int V, bool kMaxMode, bool kAllTabulated>
__global__ void __launch_bounds__(kMaxThreads)
    roi_align_forward_kernel(const LevelTable<const scalar_t> levels, const RoiRows rois,
                             const int64_t* __restrict__ roi_levels, const PoolParams params, const Tiling tiling,
                             scalar_t* __restrict__ out, int32_t* __restrict__ argmax) {
  extern __shared__ __align__(16) unsigned char shared_memory[];
  const BlockTiles<scalar_t> tiles(shared_memory, tiling);
  const BlockWork work = block_work(tiling, params);
  acc_t roi[5];
  load_roi(rois, work.roi, roi);
  const int64_t channels = levels.channels;
  const int64_t lane_channel = work.first_channel + int64_t{work.lane} * V;  // V divides channels when V > 1
  scalar_t* lane_values = tiles.values + work.lane * tiling.lane_pitch;
  int32_t* lane_argmax = tiles.argmax + work.lane * tiling.lane_pitch;

  int level;
  int64_t batch_index;
  if (roi_source(roi, roi_levels, work.roi, levels, level, batch_index)) {  // block-uniform
    const SampleGrid<acc_t> grid =
        sample_grid<kMaxMode>(roi_bins(roi, static_cast<acc_t>(levels.spatial_scale[level]), params),
                              plane_shape(levels, level), params, tiling, shared_memory);
    wait_for_preceding_kernel();  // the maps may be the relayout's output
    // Lanes past the last channel read channel 0 (in bounds); their rows of the tile are never written out.
    const scalar_t* lane_image = opaque_pointer(levels.data[level] + batch_index * levels.stride_n[level] +
                                                (lane_channel < channels ? lane_channel : 0) * levels.stride_c[level]);
    with_tabulation<kAllTabulated>(grid, [&](auto tabulated) {
      constexpr bool kTabulated = decltype(tabulated)::value;
      BinCursor cursor(work.first_bin + work.group, work.num_groups, work.pooled_width);
      for (int b = work.group; b < work.num_bins; b += work.num_groups, cursor.advance()) {
        const int ph = cursor.ph, pw = cursor.pw;
        acc_t pooled[V];
        if constexpr (kMaxMode) {
          int32_t best_sample[V];
          max_of_bin<kTabulated, V>(grid, ph, pw, lane_image, pooled, best_sample);
#pragma unroll
          for (int v = 0; v < V; ++v) lane_argmax[v * tiling.bins_per_block + b] = best_sample[v];
        } else {
          average_bin<kTabulated, V>(grid, ph, pw, lane_image, pooled);
        }
#pragma unroll
        for (int v = 0; v < V; ++v) lane_values[v * tiling.bins_per_block + b] = static_cast<scalar_t>(pooled[v]);
      }
    });
  } else {  // a RoI with a bad batch index or level pools zeros
    for (int b = work.group; b < work.num_bins; b += work.num_groups) {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        lane_values[v * tiling.bins_per_block + b] = scalar_t(0);
        if (kMaxMode) lane_argmax[v * tiling.bins_per_block + b] = -1;
      }
    }
  }
  __syncthreads();
  for_each_tile_element<V>(work, tiling, channels, [&](int tile_index, int64_t index) {
    store_evict_first(out + index, tiles.values[tile_index]);
    if (kMaxMode) store_evict_first(argmax + index, tiles.argmax[tile_index]);
  });
}

// grads: one NHWC buffer per level in the accumulation type; grad_output and argmax contiguous (K, C, PH, PW).
template <typename scalar_t, typename acc_t, int V, bool kMaxMode>
__global__ void __launch_bounds__(kMaxThreads)
    roi_align_backward_kernel(const LevelTable<acc_t> grads, const RoiRows rois,
                              const int64_t* __restrict__ roi_levels, const PoolParams params, const Tiling tiling,
                              const scalar_t* __restrict__ grad_output, const int32_t* __restrict__ argmax) {
  extern __shared__ __align__(16) unsigned char shared_memory[];
  const BlockTiles<scalar_t> tiles(shared_memory, tiling);
  const BlockWork work = block_work(tiling, params);
  acc_t roi[5];
  load_roi(rois, work.roi, roi);
  const int64_t channels = grads.channels;

  int level;
  int64_t batch_index;
  if (!roi_source(roi, roi_levels, work.roi, grads, level, batch_index)) return;  // block-uniform

  const SampleGrid<acc_t> grid =
      sample_grid<kMaxMode>(roi_bins(roi, static_cast<acc_t>(grads.spatial_scale[level]), params),
                            plane_shape(grads, level), params, tiling, shared_memory);
  for_each_tile_element<V>(work, tiling, channels, [&](int tile_index, int64_t index) {
    tiles.values[tile_index] = grad_output[index];
    if (kMaxMode) tiles.argmax[tile_index] = argmax[index];
  });
  __syncthreads();

  const int64_t lane_channel = work.first_channel + int64_t{work.lane} * V;
  if (lane_channel >= channels) return;  // no barriers below
  const int num_samples = grid.bins.grid_h * grid.bins.grid_w;
  // Not an opaque_pointer: the atomics would then take the generic path (ATOM instead of REDG), slower.
  acc_t* lane_image = grads.data[level] + batch_index * grads.stride_n[level] + lane_channel * grads.stride_c[level];
  const scalar_t* lane_gradients = tiles.values + work.lane * tiling.lane_pitch;
  const int32_t* lane_argmax = tiles.argmax + work.lane * tiling.lane_pitch;
  with_tabulation<false>(grid, [&](auto tabulated) {
    constexpr bool kTabulated = decltype(tabulated)::value;
    BinCursor cursor(work.first_bin + work.group, work.num_groups, work.pooled_width);
    for (int b = work.group; b < work.num_bins; b += work.num_groups, cursor.advance()) {
      const int ph = cursor.ph, pw = cursor.pw;
      if constexpr (kMaxMode) {  // each channel sends its gradient to its own best sample
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const int32_t best_sample = lane_argmax[v * tiling.bins_per_block + b];
          if (best_sample < 0 || best_sample >= num_samples) continue;
          const int iy = best_sample / grid.bins.grid_w;
          const auto taps =
              point_taps(grid.template y_taps<kTabulated>(ph, iy),
                         grid.template x_taps<kTabulated>(pw, best_sample - iy * grid.bins.grid_w));
          if (!taps.valid) continue;
          const acc_t gradient = static_cast<acc_t>(lane_gradients[v * tiling.bins_per_block + b]);
#pragma unroll
          for (int tap = 0; tap < 4; ++tap)
            atomicAdd(lane_image + taps.offset[tap] + v, taps.weight[tap] * gradient);
        }
      } else {
        acc_t share[V], contribution[V];
#pragma unroll
        for (int v = 0; v < V; ++v) share[v] = static_cast<acc_t>(lane_gradients[v * tiling.bins_per_block + b]);
        divide_by_count<V>(share, max(num_samples, 1));
        const auto scatter = [&](auto offset, acc_t weight) {
#pragma unroll
          for (int v = 0; v < V; ++v) contribution[v] = weight * share[v];
          atomic_add_packet<V>(lane_image + offset, contribution);
        };
        if constexpr (kTabulated) {
          for_each_bin_tap(grid, ph, pw, scatter);
        } else {
          for_each_sample<false>(grid, ph, pw, [&](int, const auto& taps) {
            if (!taps.valid) return;
#pragma unroll
            for (int tap = 0; tap < 4; ++tap) scatter(taps.offset[tap], taps.weight[tap]);
          });
        }
      }
    }
  });
}

bool capturing_graph() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

constexpr int kCheckThreads = 256;

// NaN-propagating min and max, for the batch-index range.
template <typename T>
__device__ __forceinline__ T lowest_of(T a, T b) {
  return a != a || a < b ? a : b;
}

template <typename T>
__device__ __forceinline__ T highest_of(T a, T b) {
  return a != a || a > b ? a : b;
}

// The lowest and highest batch index (rois[:, 0]) of each block's RoIs, a RoI per thread, into block_ranges[2b] and
// [2b + 1] (NaN if one is NaN).
template <typename roi_t, typename acc_t>
__global__ void __launch_bounds__(kCheckThreads)
    batch_index_range_kernel(const roi_t* __restrict__ rois, int64_t num_rois, int64_t stride_k,
                             acc_t* __restrict__ block_ranges) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kCheckThreads + threadIdx.x;
  acc_t lowest = ::cuda::std::numeric_limits<acc_t>::infinity(), highest = -lowest;
  if (k < num_rois) lowest = highest = static_cast<acc_t>(rois[k * stride_k]);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    lowest = lowest_of(lowest, __shfl_down_sync(0xffffffffu, lowest, offset));
    highest = highest_of(highest, __shfl_down_sync(0xffffffffu, highest, offset));
  }
  __shared__ acc_t warp_ranges[kCheckThreads / kWarpSize][2];
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) warp_ranges[warp][0] = lowest, warp_ranges[warp][1] = highest;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kCheckThreads / kWarpSize; ++w) {
    lowest = lowest_of(lowest, warp_ranges[w][0]);
    highest = highest_of(highest, warp_ranges[w][1]);
  }
  block_ranges[2 * blockIdx.x] = lowest;
  block_ranges[2 * blockIdx.x + 1] = highest;
}

// Checks the rois' batch indices without stalling the GPU. The constructor, called before the pooling work is queued,
// marks the point in the stream where the rois are ready; finish(), called after, launches one small kernel that
// writes each block's index range to pinned host memory, on a high-priority side stream that waits for that point
// alone, so that it runs beside the queued work (its blocks are scheduled ahead of the pooling kernel's), and waits
// for that launch alone while the pooling kernel runs on. The host's work for the check thus overlaps the pooling
// kernel instead of delaying its launch. A bad index pools zeros in the meantime (the kernels never read outside the
// maps), then finish() raises. Not checked under CUDA graph capture.
class BatchIndexCheck {
 public:
  BatchIndexCheck(const at::Tensor& rois, const c10::cuda::CUDAStream& stream)
      : rois_(rois), device_(stream.device_index()) {
    if (rois.size(0) == 0 || capturing_graph()) return;
    // One event: the side stream waits for this record, finish() for the side stream's.
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  BatchIndexCheck(const BatchIndexCheck&) = delete;
  BatchIndexCheck& operator=(const BatchIndexCheck&) = delete;
  ~BatchIndexCheck() {
    if (event_ == nullptr) return;
    // On an early exit, the GPU may still be reading the rois and writing the pinned ranges: wait before they go.
    C10_CUDA_CHECK_WARN(cudaEventSynchronize(event_));
    C10_CUDA_CHECK_WARN(cudaEventDestroy(event_));
  }

  // Raises unless every batch index lies in [0, batch).
  void finish(const char* op, int64_t batch) {
    if (event_ == nullptr) return;
    const int64_t num_rois = rois_.size(0);
    const int64_t blocks = (num_rois + kCheckThreads - 1) / kCheckThreads;
    ranges_ = at::empty({blocks, 2}, at::TensorOptions(accumulation_dtype(rois_.scalar_type())).pinned_memory(true));
    void* device_ranges = nullptr;
    C10_CUDA_CHECK(cudaHostGetDevicePointer(&device_ranges, ranges_.mutable_data_ptr(), 0));
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_);
    C10_CUDA_CHECK(cudaStreamWaitEvent(side, event_, 0));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rois_.scalar_type(), "batch_index_range", [&] {
      using acc_t = at::opmath_type<scalar_t>;  // float64 rois come only with float64 features
      batch_index_range_kernel<scalar_t, acc_t><<<blocks, kCheckThreads, 0, side>>>(
          rois_.const_data_ptr<scalar_t>(), num_rois, rois_.stride(0), static_cast<acc_t*>(device_ranges));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    C10_CUDA_CHECK(cudaEventRecord(event_, side));
    C10_CUDA_CHECK(cudaEventSynchronize(event_));
    if (ranges_.scalar_type() == at::kFloat) check_ranges(op, ranges_.const_data_ptr<float>(), batch);
    else check_ranges(op, ranges_.const_data_ptr<double>(), batch);
  }

 private:
  template <typename acc_t>
  void check_ranges(const char* op, const acc_t* values, int64_t batch) const {
    double lowest = values[0], highest = values[1];
    for (int64_t i = 1; i < ranges_.size(0); ++i) {  // NaN propagates, as in the kernel
      lowest = std::isnan(lowest) || lowest < values[2 * i] ? lowest : values[2 * i];
      highest = std::isnan(highest) || highest > values[2 * i + 1] ? highest : values[2 * i + 1];
    }
    check_batch_index_range(op, lowest, highest, batch);
  }

  at::Tensor rois_;
  c10::DeviceIndex device_;
  at::Tensor ranges_;
  cudaEvent_t event_ = nullptr;
};

// Widest packet (at most kMaxBytes) that every level allows: channels-last maps whose channels, strides and base
// address are multiples of it. 1 (one channel per lane, any strides) otherwise.
template <int kMaxBytes, typename element_t>
int packet_width(at::TensorList maps) {
  for (int width = kMaxBytes / static_cast<int>(sizeof(element_t)); width > 1; width /= 2) {
    bool fits = true;
    for (const at::Tensor& map : maps) {
      fits = fits && map.stride(1) == 1 && map.size(1) % width == 0 && map.stride(0) % width == 0 &&
             map.stride(2) % width == 0 && map.stride(3) % width == 0 &&
             reinterpret_cast<uintptr_t>(map.const_data_ptr()) % (width * sizeof(element_t)) == 0;
    }
    if (fits) return width;
  }
  return 1;
}

// Calls launch(std::integral_constant<int, V>) with V = width, instantiating only packets of <= kMaxBytes.
template <int kMaxBytes, typename element_t, typename Launch>
void with_packet_width(int width, Launch&& launch) {
  constexpr int widest = kMaxBytes / static_cast<int>(sizeof(element_t));
  static_assert(widest <= 8, "packets of at most 8 elements");
  if constexpr (widest >= 8) {
    if (width == 8) return launch(std::integral_constant<int, 8>());
  }
  if constexpr (widest >= 4) {
    if (width == 4) return launch(std::integral_constant<int, 4>());
  }
  if (width == 2) return launch(std::integral_constant<int, 2>());
  launch(std::integral_constant<int, 1>());
}

// Bytes of channels a lane pools (one 16-byte load per tap, forward; a float4 atomic, backward), and of the vectors
// of the transposes. Wider forward packets for 16-bit maps (two loads per tap, 16 channels a lane) measured slower
// on an H200 once a bin's taps were merged: 58.9 instead of 54.3 us for the benchmark's (4, 256, 80, 80) float16 case.
constexpr int kPacketBytes = 16;

constexpr int kTransposeTile = 64;
constexpr int kTransposeThreads = 256;

// Each image of `in` is a (rows, cols) matrix; out gets its transpose, cast to out_t. A block moves a 64 x 64 tile
// through shared memory so that the reads (along cols) and the writes (along rows) are both coalesced, V elements
// at a time as one vector (V divides rows and cols).
template <typename in_t, typename out_t, int V>
__global__ void __launch_bounds__(kTransposeThreads)
    transpose_kernel(const in_t* __restrict__ in, out_t* __restrict__ out, int64_t rows, int64_t cols) {
  // A kernel launched as this one's programmatic dependent (the pooling kernel, forward) may start once every block
  // of this grid has started, rather than exited: its blocks take the SMs that this grid's last wave leaves idle and
  // tabulate their taps there; they wait for this grid's completion before they read its output.
  allow_dependent_launch();
  constexpr int kVectorsPerLine = kTransposeTile / V;
  __shared__ out_t tile[kTransposeTile][kTransposeTile + 1];  // +1: spreads the column accesses over the banks
  const int64_t image_offset = static_cast<int64_t>(blockIdx.z) * rows * cols;
  in += image_offset;
  out += image_offset;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kTransposeTile;
  const int64_t first_col = static_cast<int64_t>(blockIdx.x) * kTransposeTile;
  // All of a thread's loads first, then the stores into the tile: the loads are in flight together (a load followed
  // by its store, pass by pass, kept one 16-byte load in flight per thread: 17.6 us for a (4, 256, 80, 80) float32
  // map on an H200).
  constexpr int kPasses = kTransposeTile * kVectorsPerLine / kTransposeThreads;
  static_assert(kPasses * kTransposeThreads == kTransposeTile * kVectorsPerLine, "whole passes over the tile");
  Packet<in_t, V> packets[kPasses];
  bool inside[kPasses];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int i = threadIdx.x + pass * kTransposeThreads, r = i / kVectorsPerLine, c = i % kVectorsPerLine * V;
    const int64_t row = first_row + r, col = first_col + c;
    inside[pass] = row < rows && col < cols;
    // Read once: evict-first, so that the L2 cache keeps the output (which the pooling kernel reads next).
    if (inside[pass]) packets[pass] = load_packet<in_t, V, true>(in + row * cols + col);
  }
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int i = threadIdx.x + pass * kTransposeThreads, r = i / kVectorsPerLine, c = i % kVectorsPerLine * V;
    if (!inside[pass]) continue;
#pragma unroll
    for (int v = 0; v < V; ++v) tile[r][c + v] = static_cast<out_t>(packets[pass].value[v]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kTransposeTile * kVectorsPerLine; i += kTransposeThreads) {
    const int c = i / kVectorsPerLine, r = i % kVectorsPerLine * V;
    const int64_t row = first_row + r, col = first_col + c;
    if (row >= rows || col >= cols) continue;
    Packet<out_t, V> packet;
#pragma unroll
    for (int v = 0; v < V; ++v) packet.value[v] = tile[r + v][c];
    *reinterpret_cast<Packet<out_t, V>*>(out + col * rows + row) = packet;
  }
}

// `map` (N, C, H, W) copied into a new tensor of out_t in memory `format`. A dense NCHW map going channels-last, or
// a dense channels-last map going NCHW, takes the tiled transpose (at::Tensor::copy_ takes a generic strided path
// for those, several times slower); anything else takes copy_.
template <typename in_t, typename out_t>
at::Tensor relayout(const at::Tensor& map, at::ScalarType out_dtype, at::MemoryFormat format, cudaStream_t stream) {
  at::Tensor out = at::empty(map.sizes(), map.options().dtype(out_dtype).memory_format(format));
  const bool to_channels_last = format == at::MemoryFormat::ChannelsLast;
  const bool transposes = to_channels_last ? map.is_contiguous() : map.is_contiguous(at::MemoryFormat::ChannelsLast);
  const int64_t batch = map.size(0), channels = map.size(1), pixels = map.size(2) * map.size(3);
  const int64_t rows = to_channels_last ? channels : pixels, cols = to_channels_last ? pixels : channels;
  const int64_t grid_x = (cols + kTransposeTile - 1) / kTransposeTile;
  const int64_t grid_y = (rows + kTransposeTile - 1) / kTransposeTile;
  if (!transposes || grid_x >= (int64_t{1} << 31) || grid_y > 65535 || batch > 65535) return out.copy_(map);
  // The widest vector (of the wider type) that divides both sides; the allocations are aligned.
  using wider_t = std::conditional_t<(sizeof(in_t) > sizeof(out_t)), in_t, out_t>;
  int width = kPacketBytes / static_cast<int>(sizeof(wider_t));
  while (width > 1 && (rows % width != 0 || cols % width != 0 ||
                       reinterpret_cast<uintptr_t>(map.const_data_ptr()) % (width * sizeof(in_t)) != 0))
    width /= 2;
  with_packet_width<kPacketBytes, wider_t>(width, [&](auto packet) {
    transpose_kernel<in_t, out_t, decltype(packet)::value>
        <<<dim3(grid_x, grid_y, batch), kTransposeThreads, 0, stream>>>(map.const_data_ptr<in_t>(),
                                                                       out.mutable_data_ptr<out_t>(), rows, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

// The device's compute capability (major), asked once per process for every device.
int compute_capability_major(c10::DeviceIndex device) {
  static const std::vector<int> majors = [] {
    std::vector<int> result(c10::cuda::device_count());
    for (int index = 0; index < static_cast<int>(result.size()); ++index)
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&result[index], cudaDevAttrComputeCapabilityMajor, index));
    return result;
  }();
  return majors.at(device);
}

template <typename Kernel>
void allow_shared_memory(Kernel kernel, int64_t bytes) {
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

const int64_t* levels_or_null(const at::Tensor& roi_levels) {
  return roi_levels.defined() ? roi_levels.const_data_ptr<int64_t>() : nullptr;
}

std::tuple<at::Tensor, at::Tensor> multiscale_forward_cuda(at::TensorList features, const at::Tensor& rois,
                                                           const at::Tensor& roi_levels, int64_t pooled_height,
                                                           int64_t pooled_width, at::ArrayRef<double> spatial_scales,
                                                           int64_t sampling_ratio, bool aligned, bool max_mode) {
  TORCH_CHECK(!features.empty() && features[0].is_cuda(), "roi_align: features must be CUDA tensors");
  const c10::cuda::CUDAGuard device_guard(features[0].device());
  const CheckedArgs args = check_forward_args("roi_align", features, rois, roi_levels, pooled_height, pooled_width,
                                              spatial_scales, sampling_ratio, aligned, max_mode, false);
  const at::Tensor& first = features[0];
  const int64_t num_rois = rois.size(0), channels = first.size(1);
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
  // The output and, in max mode, argmax ((0,) in avg mode).
  const auto pooled_outputs = [&] {
    at::Tensor out = at::empty({num_rois, channels, pooled_height, pooled_width}, first.options());
    at::Tensor argmax = at::empty(max_mode ? out.sizes() : at::IntArrayRef{0}, first.options().dtype(at::kInt));
    return std::make_tuple(out, argmax);
  };
  BatchIndexCheck batch_index_check(rois, stream);
  if (num_rois == 0 || channels == 0) {
    batch_index_check.finish("roi_align", first.size(0));
    return pooled_outputs();
  }

  at::Tensor out, argmax;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, first.scalar_type(), "roi_align_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    // Channels-last makes a lane's channels contiguous; maps already in that layout (or with unit channel stride,
    // e.g. a channels-last slice) are used in place. Transposed first, so that the GPU works while the host launches
    // the rest.
    std::vector<at::Tensor> channels_last;
    bool relaid_out = false;
    for (const at::Tensor& map : features) {
      const bool in_place = map.stride(1) == 1;
      relaid_out = relaid_out || !in_place;
      channels_last.push_back(in_place ? map
                                       : relayout<scalar_t, scalar_t>(map, map.scalar_type(),
                                                                      at::MemoryFormat::ChannelsLast, stream));
    }
    std::tie(out, argmax) = pooled_outputs();
    const int width = packet_width<kPacketBytes, scalar_t>(channels_last);
    with_packet_width<kPacketBytes, scalar_t>(width, [&](auto packet) {
      constexpr int V = decltype(packet)::value;
      const Tiling tiling = make_tiling(channels_last, num_rois, channels, args.params, V, sizeof(scalar_t),
                                        kTapTableBytes<acc_t>, kTapTable);
      // Avg and max mode are separate kernels: max mode's per-channel argmax state would cost avg mode registers.
      const auto kernel =
          max_mode ? (tiling.all_tabulated ? roi_align_forward_kernel<scalar_t, acc_t, V, true, true>
                                           : roi_align_forward_kernel<scalar_t, acc_t, V, true, false>)
                   : (tiling.all_tabulated ? roi_align_forward_kernel<scalar_t, acc_t, V, false, true>
                                           : roi_align_forward_kernel<scalar_t, acc_t, V, false, false>);
      allow_shared_memory(kernel, tiling.shared_bytes);
      // After a relayout (the transpose, or copy_ for other strides; sm_90 and later), the pooling kernel is launched
      // as the relayout kernel's programmatic dependent: its blocks start once the transpose's last blocks run (once
      // copy_'s last ones finish) and tabulate their taps before waiting for the maps. Everything else they touch
      // (rois, out) was ready before the relayout started. Without one, the rois may come from the kernel just
      // before, so the launch is plain.
      cudaLaunchAttribute overlap;
      overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      overlap.val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(static_cast<unsigned int>(tiling.blocks));
      config.blockDim = dim3(tiling.threads);
      config.dynamicSmemBytes = static_cast<size_t>(tiling.shared_bytes);
      config.stream = stream;
      config.attrs = &overlap;
      config.numAttrs = relaid_out && compute_capability_major(stream.device_index()) >= 9 ? 1 : 0;
      C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, level_table<const scalar_t>(channels_last, spatial_scales),
                                        roi_rows(rois), levels_or_null(args.roi_levels), args.params, tiling,
                                        out.mutable_data_ptr<scalar_t>(),
                                        max_mode ? argmax.mutable_data_ptr<int32_t>() : nullptr));
    });
    batch_index_check.finish("roi_align", first.size(0));
  });
  return {out, argmax};
}

std::vector<at::Tensor> multiscale_backward_cuda(const at::Tensor& grad_output, const at::Tensor& rois,
                                                 const at::Tensor& roi_levels, const at::Tensor& argmax,
                                                 at::IntArrayRef feature_shapes, at::ArrayRef<double> spatial_scales,
                                                 int64_t sampling_ratio, bool aligned, bool max_mode) {
  TORCH_CHECK(grad_output.is_cuda(), "roi_align_backward: grad_output must be a CUDA tensor");
  const c10::cuda::CUDAGuard device_guard(grad_output.device());
  const CheckedArgs args = check_backward_args("roi_align_backward", grad_output, rois, roi_levels, argmax,
                                               feature_shapes, spatial_scales, sampling_ratio, aligned, max_mode);
  const at::ScalarType dtype = grad_output.scalar_type();
  // Gradients accumulate in NHWC buffers of the accumulation type, viewed as (N, C, H, W).
  std::vector<at::Tensor> buffers;
  for (size_t level = 0; level < feature_shapes.size() / 4; ++level) {
    const at::IntArrayRef shape = feature_shapes.slice(4 * level, 4);
    const at::TensorOptions options = grad_output.options().dtype(accumulation_dtype(dtype));
    buffers.push_back(at::zeros({shape[0], shape[2], shape[3], shape[1]}, options).permute({0, 3, 1, 2}));
  }
  if (grad_output.numel() > 0) {
    const at::Tensor grad_contiguous = grad_output.contiguous();
    const at::Tensor argmax_contiguous = max_mode ? argmax.contiguous() : argmax;
    const int64_t channels = grad_output.size(1);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "roi_align_backward_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const int width = packet_width<kPacketBytes, acc_t>(buffers);
      with_packet_width<kPacketBytes, acc_t>(width, [&](auto packet) {
        constexpr int V = decltype(packet)::value;
        const Tiling tiling = make_tiling(buffers, rois.size(0), channels, args.params, V, sizeof(scalar_t),
                                          kTapTableBytes<acc_t>, kTapTable);
        const auto kernel = max_mode ? roi_align_backward_kernel<scalar_t, acc_t, V, true>
                                     : roi_align_backward_kernel<scalar_t, acc_t, V, false>;
        allow_shared_memory(kernel, tiling.shared_bytes);
        kernel<<<tiling.blocks, tiling.threads, tiling.shared_bytes, stream>>>(
            level_table<acc_t>(buffers, spatial_scales), roi_rows(rois),
            levels_or_null(args.roi_levels), args.params, tiling, grad_contiguous.const_data_ptr<scalar_t>(),
            max_mode ? argmax_contiguous.const_data_ptr<int32_t>() : nullptr);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  }
  // One transposing (and, for 16-bit types, casting) copy per level into the contiguous (N, C, H, W) result.
  std::vector<at::Tensor> grads;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "roi_align_backward_layout", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    for (const at::Tensor& buffer : buffers)
      grads.push_back(relayout<acc_t, scalar_t>(buffer, dtype, at::MemoryFormat::Contiguous,
                                                c10::cuda::getCurrentCUDAStream()));
  });
  return grads;
}

std::tuple<at::Tensor, at::Tensor> roi_align_cuda(const at::Tensor& input, const at::Tensor& rois,
                                                  int64_t pooled_height, int64_t pooled_width, double spatial_scale,
                                                  int64_t sampling_ratio, bool aligned, bool max_mode) {
  return multiscale_forward_cuda({input}, rois, at::Tensor(), pooled_height, pooled_width, {spatial_scale},
                                 sampling_ratio, aligned, max_mode);
}

at::Tensor roi_align_backward_cuda(const at::Tensor& grad_output, const at::Tensor& rois, const at::Tensor& argmax,
                                   at::IntArrayRef input_shape, double spatial_scale, int64_t sampling_ratio,
                                   bool aligned, bool max_mode) {
  return multiscale_backward_cuda(grad_output, rois, at::Tensor(), argmax, input_shape, {spatial_scale},
                                  sampling_ratio, aligned, max_mode)[0];
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CUDA, m) {
  m.impl("roi_align", &roi_align_cuda);
  m.impl("roi_align_backward", &roi_align_backward_cuda);
  m.impl("multiscale_roi_align", &multiscale_forward_cuda);
  m.impl("multiscale_roi_align_backward", &multiscale_backward_cuda);
}

}  // namespace roi_align
}  // namespace yolo_fastdetect
