// RoIAlign on the GPU: how a launch splits the work (see roi_align_cuda.cu) and what a block works on. A block owns
// one RoI, a chunk of its output bins and a chunk of channels; its threads form groups of lanes, a group pools one bin
// at a time and a lane a packet of V channels. The block stages its part of the (K, C, PH, PW) output (or, backward,
// of the output's gradient) in a tile of shared memory, after the tap tables.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "../common/cuda_primitives.cuh"
#include "roi_align.h"
#include "roi_align_taps.cuh"

namespace yolo_fastdetect {
namespace roi_align {

constexpr int kMaxThreads = 256;
// Shared memory for one block's output tile; above 48 KiB a kernel must opt in, which the launcher does.
constexpr int64_t kMaxTileBytes = 80 * 1024;

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
inline bool plane_offsets_fit_int32(at::TensorList maps) {
  for (const at::Tensor& map : maps) {
    if ((map.size(2) - 1) * map.stride(2) + (map.size(3) - 1) * map.stride(3) >= std::numeric_limits<int32_t>::max())
      return false;
  }
  return true;
}

// maps: the NHWC maps the kernels address; vector_width: V; value_size: the bytes of a tile element (the output or
// grad_output dtype); table_bytes: the bytes of the tap tables (kTapTableBytes).
inline Tiling make_tiling(at::TensorList maps, int64_t num_rois, int64_t channels, const PoolParams& params,
                          int vector_width, int64_t value_size, int64_t table_bytes) {
  Tiling tiling;
  tiling.tap_tables = plane_offsets_fit_int32(maps);
  tiling.all_tabulated =
      params.sampling_ratio > 0 && tabulates(tiling.tap_tables, params.pooled_height, params.pooled_width,
                                             params.sampling_ratio, params.sampling_ratio);
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

inline RoiRows roi_rows(const at::Tensor& rois) {  // check_rois admits these four dtypes only
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
    case RoiRows::Dtype::kFloat:
      return load(static_cast<const float*>(nullptr));
    case RoiRows::Dtype::kDouble:
      return load(static_cast<const double*>(nullptr));
    case RoiRows::Dtype::kHalf:
      return load(static_cast<const at::Half*>(nullptr));
    case RoiRows::Dtype::kBFloat16:
      return load(static_cast<const at::BFloat16*>(nullptr));
  }
}

}  // namespace roi_align
}  // namespace yolo_fastdetect
