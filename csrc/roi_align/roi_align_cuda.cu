// RoIAlign on the GPU: forward and backward, one or several levels in one launch.
//
// Work split: a block owns one RoI, a chunk of its output bins and a chunk of channels. Its threads form groups of
// `group_size` lanes (up to a warp); a group pools one bin at a time and each lane owns a packet of V consecutive
// channels. On channels-last (NHWC) features a bilinear tap is then one V-wide vector load per lane (16 bytes),
// coalesced across the group, and the sample geometry (group-uniform) is computed once per packet of V channels
// instead of once per channel. The launcher hands the kernels NHWC features (converting NCHW
// ones with a tiled transpose) and accumulates gradients in an NHWC buffer, where the backward pass adds a packet
// with vector atomics (float4 on sm_90). The (K, C, PH, PW) output is staged through shared memory so that each
// block writes (and, backward, reads) whole runs of consecutive bins, not one element per channel plane.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda/std/limits>
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
  int64_t tile_stride;   // shared-memory row (one channel's bins); odd, so that lanes' rows fall in distinct banks
  int64_t value_bytes;   // bytes of the value tile, rounded up so that the argmax tile after it is aligned
  int64_t shared_bytes;  // value tile, plus the int32 argmax tile in max mode
  int64_t blocks;
};

// vector_width: V; value_size: the bytes of a tile element (the output or grad_output dtype).
Tiling make_tiling(int64_t num_rois, int64_t channels, int64_t num_bins, int vector_width, int64_t value_size,
                   bool max_mode) {
  Tiling tiling;
  const int64_t packets = (channels + vector_width - 1) / vector_width;
  tiling.group_size = 1;
  while (tiling.group_size < kWarpSize && tiling.group_size < packets) tiling.group_size *= 2;
  tiling.chunk_channels = int64_t{tiling.group_size} * vector_width;
  tiling.channel_chunks = (channels + tiling.chunk_channels - 1) / tiling.chunk_channels;
  const int64_t bytes_per_bin = tiling.chunk_channels * (value_size + (max_mode ? 4 : 0));
  const int64_t max_bins = std::max<int64_t>(kMaxTileBytes / bytes_per_bin - 1, 1);  // -1: the odd-stride pad
  tiling.bin_chunks = (num_bins + max_bins - 1) / max_bins;
  tiling.bins_per_block = (num_bins + tiling.bin_chunks - 1) / tiling.bin_chunks;
  // As many groups as make the rounds over the bins even (49 bins: 25 groups twice, not 32 then 17).
  const int64_t max_groups = kMaxThreads / tiling.group_size;
  const int64_t rounds = (tiling.bins_per_block + max_groups - 1) / max_groups;
  const int64_t groups = (tiling.bins_per_block + rounds - 1) / rounds;
  tiling.threads = static_cast<int>((groups * tiling.group_size + kWarpSize - 1) / kWarpSize * kWarpSize);
  tiling.tile_stride = tiling.bins_per_block | 1;
  tiling.value_bytes = (tiling.chunk_channels * tiling.tile_stride * value_size + 15) / 16 * 16;
  tiling.shared_bytes = tiling.value_bytes + (max_mode ? tiling.chunk_channels * tiling.tile_stride * 4 : 0);
  tiling.blocks = num_rois * tiling.channel_chunks * tiling.bin_chunks;
  TORCH_CHECK(tiling.blocks < (int64_t{1} << 31), "roi_align: too many RoIs x channels x bins for one launch");
  return tiling;
}

// Block index -> (RoI, bin chunk, channel chunk), channel chunks fastest so neighbouring blocks share taps.
struct BlockWork {
  int64_t roi;
  int64_t first_bin;
  int num_bins;  // bins of this chunk
  int64_t first_channel;
};

__device__ __forceinline__ BlockWork block_work(const Tiling& tiling, int64_t num_bins) {
  const int64_t block = blockIdx.x;
  BlockWork work;
  const int64_t channel_chunk = block % tiling.channel_chunks;
  const int64_t bin_chunk = (block / tiling.channel_chunks) % tiling.bin_chunks;
  work.roi = block / (tiling.channel_chunks * tiling.bin_chunks);
  work.first_bin = bin_chunk * tiling.bins_per_block;
  work.num_bins = static_cast<int>(min(tiling.bins_per_block, num_bins - work.first_bin));
  work.first_channel = channel_chunk * tiling.chunk_channels;
  return work;
}

// Calls visit(tile index, output index) for every element of the block's tile that exists in the (K, C, PH, PW)
// output; consecutive threads take consecutive bins of one channel, i.e. consecutive output addresses.
template <typename Visit>
__device__ __forceinline__ void for_each_tile_element(const BlockWork& work, const Tiling& tiling, int64_t channels,
                                                      int64_t num_bins, Visit visit) {
  const int count = static_cast<int>(tiling.chunk_channels) * work.num_bins;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int row = i / work.num_bins, b = i - row * work.num_bins;
    const int64_t channel = work.first_channel + row;
    if (channel >= channels) break;  // rows grow with i
    visit(row * tiling.tile_stride + b, (work.roi * channels + channel) * num_bins + work.first_bin + b);
  }
}

// The sample's bilinear value for the lane's V channels (0 outside the map), summed in interpolate()'s order.
template <int V, typename scalar_t, typename acc_t>
__device__ __forceinline__ void interpolate_packet(const scalar_t* lane_image, const PointTaps<acc_t>& taps,
                                                   acc_t (&value)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) value[v] = acc_t(0);
  if (!taps.valid) return;
#pragma unroll
  for (int tap = 0; tap < 4; ++tap) {
    const Packet<scalar_t, V> packet = *reinterpret_cast<const Packet<scalar_t, V>*>(lane_image + taps.offset[tap]);
#pragma unroll
    for (int v = 0; v < V; ++v) value[v] += taps.weight[tap] * static_cast<acc_t>(packet.value[v]);
  }
}

template <int V>
__device__ __forceinline__ void atomic_add_packet(float* address, const float (&values)[V]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (V % 4 == 0) {  // sm_90 adds a float4 in one instruction
#pragma unroll
    for (int v = 0; v < V; v += 4)
      atomicAdd(reinterpret_cast<float4*>(address + v),
                make_float4(values[v], values[v + 1], values[v + 2], values[v + 3]));
    return;
  }
#endif
#pragma unroll
  for (int v = 0; v < V; ++v) atomicAdd(address + v, values[v]);
}

template <int V>
__device__ __forceinline__ void atomic_add_packet(double* address, const double (&values)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) atomicAdd(address + v, values[v]);
}

// The lanes of one group: the shuffle mask (groups are aligned, power-of-two runs of lanes inside a warp).
__device__ __forceinline__ unsigned group_mask(int group_size) {
  if (group_size == kWarpSize) return 0xffffffffu;
  const int first_lane = (threadIdx.x % kWarpSize) / group_size * group_size;
  return ((1u << group_size) - 1u) << first_lane;
}

// Taps of sample `sample` (= iy * grid_w + ix, the argmax numbering) of bin (ph, pw).
template <typename acc_t>
__device__ __forceinline__ PointTaps<acc_t> sample_taps(const RoiBins<acc_t>& bins, int64_t ph, int64_t pw,
                                                        int sample, int64_t height, int64_t width, int64_t stride_h,
                                                        int64_t stride_w) {
  const int iy = sample / bins.grid_w, ix = sample - iy * bins.grid_w;
  return point_taps(axis_taps(sample_coordinate(bins.start_y, bins.bin_height, ph, iy, bins.grid_h), height),
                    axis_taps(sample_coordinate(bins.start_x, bins.bin_width, pw, ix, bins.grid_w), width), stride_h,
                    stride_w);
}

// Lane `source_lane`'s taps, for every lane of the group.
template <typename acc_t>
__device__ __forceinline__ PointTaps<acc_t> shuffle_taps(const PointTaps<acc_t>& taps, int source_lane,
                                                         unsigned mask, int group_size) {
  PointTaps<acc_t> shared;
  shared.valid = __shfl_sync(mask, static_cast<int>(taps.valid), source_lane, group_size) != 0;
#pragma unroll
  for (int tap = 0; tap < 4; ++tap) {
    shared.offset[tap] = __shfl_sync(mask, static_cast<long long>(taps.offset[tap]), source_lane, group_size);
    shared.weight[tap] = __shfl_sync(mask, taps.weight[tap], source_lane, group_size);
  }
  return shared;
}

// Calls visit(sample, taps) for every sample of bin (ph, pw) in order. The geometry is the same for every lane of a
// group and costs more instructions than a lane's loads and FMAs, so lane l computes the taps of sample first + l
// and the group reads them back one sample at a time. Every lane of the group must call this (it shuffles).
template <typename acc_t, typename Visit>
__device__ __forceinline__ void for_each_sample(const RoiBins<acc_t>& bins, int64_t ph, int64_t pw, int64_t height,
                                                int64_t width, int64_t stride_h, int64_t stride_w, int lane,
                                                int group_size, unsigned mask, Visit visit) {
  const int num_samples = bins.grid_h * bins.grid_w;
  for (int first = 0; first < num_samples; first += group_size) {
    PointTaps<acc_t> mine = {false, {0, 0, 0, 0}, {acc_t(0), acc_t(0), acc_t(0), acc_t(0)}};
    if (first + lane < num_samples) mine = sample_taps(bins, ph, pw, first + lane, height, width, stride_h, stride_w);
    const int count = min(group_size, num_samples - first);
    for (int j = 0; j < count; ++j) visit(first + j, shuffle_taps(mine, j, mask, group_size));
  }
}

template <typename scalar_t, typename acc_t, int V, bool kMaxMode>
__global__ void __launch_bounds__(kMaxThreads)
    roi_align_forward_kernel(const LevelTable<const scalar_t> levels, const acc_t* __restrict__ rois,
                             const int64_t* __restrict__ roi_levels, const PoolParams params, const Tiling tiling,
                             scalar_t* __restrict__ out, int32_t* __restrict__ argmax) {
  extern __shared__ __align__(16) unsigned char shared_memory[];
  scalar_t* value_tile = reinterpret_cast<scalar_t*>(shared_memory);
  int32_t* argmax_tile = reinterpret_cast<int32_t*>(shared_memory + tiling.value_bytes);
  const int64_t num_bins = params.pooled_height * params.pooled_width;
  const BlockWork work = block_work(tiling, num_bins);
  const int lane = threadIdx.x % tiling.group_size, group = threadIdx.x / tiling.group_size;
  const int num_groups = blockDim.x / tiling.group_size;
  const int64_t channels = levels.channels;
  const int64_t lane_channel = work.first_channel + int64_t{lane} * V;  // V divides channels when V > 1
  const acc_t* roi = rois + 5 * work.roi;
  scalar_t* lane_values = value_tile + lane * V * tiling.tile_stride;
  int32_t* lane_argmax = argmax_tile + lane * V * tiling.tile_stride;

  int level;
  int64_t batch_index;
  if (roi_source(roi, roi_levels, work.roi, levels, level, batch_index)) {  // block-uniform
    const RoiBins<acc_t> bins = roi_bins(roi, static_cast<acc_t>(levels.spatial_scale[level]), params);
    const acc_t count = static_cast<acc_t>(max(bins.grid_h * bins.grid_w, 1));
    // Lanes past the last channel take part in the shuffles, reading channel 0 (in bounds); their rows of the tile
    // are never written out.
    const scalar_t* lane_image = levels.data[level] + batch_index * levels.stride_n[level] +
                                 (lane_channel < channels ? lane_channel : 0) * levels.stride_c[level];
    const int64_t height = levels.height[level], width = levels.width[level];
    const unsigned mask = group_mask(tiling.group_size);
    for (int b = group; b < work.num_bins; b += num_groups) {
      const int64_t bin = work.first_bin + b;
      const int64_t ph = bin / params.pooled_width, pw = bin - ph * params.pooled_width;
      acc_t sum[V], best[V], value[V];
      int32_t best_sample[V];
#pragma unroll
      for (int v = 0; v < V; ++v) {
        sum[v] = acc_t(0);
        best[v] = -::cuda::std::numeric_limits<acc_t>::infinity();
        best_sample[v] = -1;
      }
      for_each_sample(bins, ph, pw, height, width, levels.stride_h[level], levels.stride_w[level], lane,
                      tiling.group_size, mask, [&](int sample, const PointTaps<acc_t>& taps) {
                        interpolate_packet<V>(lane_image, taps, value);
#pragma unroll
                        for (int v = 0; v < V; ++v) {
                          if (!kMaxMode) {
                            sum[v] += value[v];
                          } else if (value[v] > best[v]) {
                            best[v] = value[v];
                            best_sample[v] = sample;
                          }
                        }
                      });
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const acc_t pooled = kMaxMode ? (best_sample[v] >= 0 ? best[v] : acc_t(0)) : sum[v] / count;
        lane_values[v * tiling.tile_stride + b] = static_cast<scalar_t>(pooled);
        if (kMaxMode) lane_argmax[v * tiling.tile_stride + b] = best_sample[v];
      }
    }
  } else {  // a RoI with a bad batch index or level pools zeros
    for (int b = group; b < work.num_bins; b += num_groups) {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        lane_values[v * tiling.tile_stride + b] = scalar_t(0);
        if (kMaxMode) lane_argmax[v * tiling.tile_stride + b] = -1;
      }
    }
  }
  __syncthreads();
  for_each_tile_element(work, tiling, channels, num_bins, [&](int64_t tile_index, int64_t index) {
    out[index] = value_tile[tile_index];
    if (kMaxMode) argmax[index] = argmax_tile[tile_index];
  });
}

// grads: one NHWC buffer per level in the accumulation type; grad_output and argmax contiguous (K, C, PH, PW).
template <typename scalar_t, typename acc_t, int V, bool kMaxMode>
__global__ void __launch_bounds__(kMaxThreads)
    roi_align_backward_kernel(const LevelTable<acc_t> grads, const acc_t* __restrict__ rois,
                              const int64_t* __restrict__ roi_levels, const PoolParams params, const Tiling tiling,
                              const scalar_t* __restrict__ grad_output, const int32_t* __restrict__ argmax) {
  extern __shared__ __align__(16) unsigned char shared_memory[];
  scalar_t* gradient_tile = reinterpret_cast<scalar_t*>(shared_memory);
  int32_t* argmax_tile = reinterpret_cast<int32_t*>(shared_memory + tiling.value_bytes);
  const int64_t num_bins = params.pooled_height * params.pooled_width;
  const BlockWork work = block_work(tiling, num_bins);
  const int lane = threadIdx.x % tiling.group_size, group = threadIdx.x / tiling.group_size;
  const int num_groups = blockDim.x / tiling.group_size;
  const int64_t channels = grads.channels;
  const acc_t* roi = rois + 5 * work.roi;

  int level;
  int64_t batch_index;
  if (!roi_source(roi, roi_levels, work.roi, grads, level, batch_index)) return;  // block-uniform

  for_each_tile_element(work, tiling, channels, num_bins, [&](int64_t tile_index, int64_t index) {
    gradient_tile[tile_index] = grad_output[index];
    if (kMaxMode) argmax_tile[tile_index] = argmax[index];
  });
  __syncthreads();

  const int64_t lane_channel = work.first_channel + int64_t{lane} * V;
  // Lanes past the last channel take part in the shuffles but add nothing.
  const bool lane_active = lane_channel < channels;
  const RoiBins<acc_t> bins = roi_bins(roi, static_cast<acc_t>(grads.spatial_scale[level]), params);
  const int num_samples = bins.grid_h * bins.grid_w;
  const acc_t count = static_cast<acc_t>(max(num_samples, 1));
  acc_t* lane_image = grads.data[level] + batch_index * grads.stride_n[level] +
                      (lane_active ? lane_channel : 0) * grads.stride_c[level];
  const int64_t height = grads.height[level], width = grads.width[level];
  const int64_t stride_h = grads.stride_h[level], stride_w = grads.stride_w[level];
  const unsigned mask = group_mask(tiling.group_size);
  const scalar_t* lane_gradients = gradient_tile + lane * V * tiling.tile_stride;
  const int32_t* lane_argmax = argmax_tile + lane * V * tiling.tile_stride;
  for (int b = group; b < work.num_bins; b += num_groups) {
    const int64_t bin = work.first_bin + b;
    const int64_t ph = bin / params.pooled_width, pw = bin - ph * params.pooled_width;
    if (kMaxMode) {  // each channel sends its gradient to its own best sample
      if (!lane_active) continue;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int32_t best_sample = lane_argmax[v * tiling.tile_stride + b];
        if (best_sample < 0 || best_sample >= num_samples) continue;
        const PointTaps<acc_t> taps = sample_taps(bins, ph, pw, best_sample, height, width, stride_h, stride_w);
        if (!taps.valid) continue;
        const acc_t gradient = static_cast<acc_t>(lane_gradients[v * tiling.tile_stride + b]);
#pragma unroll
        for (int tap = 0; tap < 4; ++tap) atomicAdd(lane_image + taps.offset[tap] + v, taps.weight[tap] * gradient);
      }
      continue;
    }
    acc_t share[V], contribution[V];
#pragma unroll
    for (int v = 0; v < V; ++v) share[v] = static_cast<acc_t>(lane_gradients[v * tiling.tile_stride + b]) / count;
    for_each_sample(bins, ph, pw, height, width, stride_h, stride_w, lane, tiling.group_size, mask,
                    [&](int, const PointTaps<acc_t>& taps) {
                      if (!taps.valid || !lane_active) return;
#pragma unroll
                      for (int tap = 0; tap < 4; ++tap) {
#pragma unroll
                        for (int v = 0; v < V; ++v) contribution[v] = taps.weight[tap] * share[v];
                        atomic_add_packet<V>(lane_image + taps.offset[tap], contribution);
                      }
                    });
  }
}

bool capturing_graph() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

constexpr int kTransposeTile = 32;
constexpr int kTransposeRowsPerPass = 8;

// Each image of `in` is a (rows, cols) matrix; out gets its transpose, cast to out_t. Tiles pass through shared
// memory so that both the reads (along cols) and the writes (along rows) are coalesced.
template <typename in_t, typename out_t>
__global__ void __launch_bounds__(kTransposeTile* kTransposeRowsPerPass)
    transpose_kernel(const in_t* __restrict__ in, out_t* __restrict__ out, int64_t rows, int64_t cols) {
  __shared__ out_t tile[kTransposeTile][kTransposeTile + 1];  // +1: the column reads hit distinct banks
  const int64_t image_offset = static_cast<int64_t>(blockIdx.z) * rows * cols;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kTransposeTile;
  const int64_t first_col = static_cast<int64_t>(blockIdx.x) * kTransposeTile;
  for (int i = threadIdx.y; i < kTransposeTile; i += kTransposeRowsPerPass) {
    const int64_t row = first_row + i, col = first_col + threadIdx.x;
    if (row < rows && col < cols) tile[i][threadIdx.x] = static_cast<out_t>(in[image_offset + row * cols + col]);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTransposeTile; i += kTransposeRowsPerPass) {
    const int64_t col = first_col + i, row = first_row + threadIdx.x;
    if (row < rows && col < cols) out[image_offset + col * rows + row] = tile[threadIdx.x][i];
  }
}

// `map` (N, C, H, W) copied into a new tensor of out_t in memory `format`. A dense NCHW map going channels-last, or
// a dense channels-last map going NCHW, takes the tiled transpose (at::Tensor::copy_ takes a generic strided path
// for those, about three times slower); anything else takes copy_.
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
  transpose_kernel<in_t, out_t>
      <<<dim3(grid_x, grid_y, batch), dim3(kTransposeTile, kTransposeRowsPerPass), 0, stream>>>(
          map.const_data_ptr<in_t>(), out.mutable_data_ptr<out_t>(), rows, cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// The batch-index check without stalling the GPU: the index range is copied to pinned memory ahead of the pooling
// kernel, and the host waits for that copy only once the kernel is queued behind it. A bad index pools zeros in
// the meantime (the kernel never reads outside the maps), and the call raises. Skipped under graph capture.
class DeferredBatchCheck {
 public:
  DeferredBatchCheck(const at::Tensor& rois, cudaStream_t stream) {
    if (rois.size(0) == 0 || capturing_graph()) return;
    const at::Tensor range = batch_index_range(rois);
    range_ = at::empty(range.sizes(), range.options().device(at::kCPU).pinned_memory(true));
    range_.copy_(range, /*non_blocking=*/true);
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(copied_, stream));
  }
  DeferredBatchCheck(const DeferredBatchCheck&) = delete;
  DeferredBatchCheck& operator=(const DeferredBatchCheck&) = delete;
  ~DeferredBatchCheck() {
    if (copied_ != nullptr) C10_CUDA_CHECK_WARN(cudaEventDestroy(copied_));
  }

  void finish(const char* op, int64_t batch) {
    if (copied_ == nullptr) return;
    C10_CUDA_CHECK(cudaEventSynchronize(copied_));
    check_batch_index_range(op, range_, batch);
  }

 private:
  at::Tensor range_;
  cudaEvent_t copied_ = nullptr;
};

// Widest packet (at most 16 bytes) that every level allows: channels-last maps whose channels, strides and base
// address are multiples of it. 1 (one channel per lane, any strides) otherwise.
template <typename element_t>
int packet_width(at::TensorList maps) {
  for (int width = 16 / static_cast<int>(sizeof(element_t)); width > 1; width /= 2) {
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

// Calls launch(std::integral_constant<int, V>) with V = width, instantiating only packets of <= 16 bytes.
template <typename element_t, typename Launch>
void with_packet_width(int width, Launch&& launch) {
  constexpr int widest = 16 / static_cast<int>(sizeof(element_t));
  if constexpr (widest >= 8) {
    if (width == 8) return launch(std::integral_constant<int, 8>());
  }
  if constexpr (widest >= 4) {
    if (width == 4) return launch(std::integral_constant<int, 4>());
  }
  if (width == 2) return launch(std::integral_constant<int, 2>());
  launch(std::integral_constant<int, 1>());
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
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  DeferredBatchCheck batch_check(rois, stream);
  at::Tensor out = at::empty({num_rois, channels, pooled_height, pooled_width}, first.options());
  at::Tensor argmax = at::empty(max_mode ? out.sizes() : at::IntArrayRef{0}, first.options().dtype(at::kInt));
  if (out.numel() == 0) {
    batch_check.finish("roi_align", first.size(0));
    return {out, argmax};
  }

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, first.scalar_type(), "roi_align_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    // Channels-last makes a lane's channels contiguous; maps already in that layout (or with unit channel stride,
    // e.g. a channels-last slice) are used in place.
    std::vector<at::Tensor> channels_last;
    for (const at::Tensor& map : features)
      channels_last.push_back(map.stride(1) == 1 ? map
                                                 : relayout<scalar_t, scalar_t>(map, map.scalar_type(),
                                                                                at::MemoryFormat::ChannelsLast, stream));
    with_packet_width<scalar_t>(packet_width<scalar_t>(channels_last), [&](auto packet) {
      constexpr int V = decltype(packet)::value;
      const Tiling tiling =
          make_tiling(num_rois, channels, pooled_height * pooled_width, V, sizeof(scalar_t), max_mode);
      // Avg and max mode are separate kernels: max mode's per-channel argmax state would cost avg mode registers.
      const auto kernel = max_mode ? roi_align_forward_kernel<scalar_t, acc_t, V, true>
                                   : roi_align_forward_kernel<scalar_t, acc_t, V, false>;
      allow_shared_memory(kernel, tiling.shared_bytes);
      kernel<<<tiling.blocks, tiling.threads, tiling.shared_bytes, stream>>>(
          level_table<const scalar_t>(channels_last, spatial_scales), args.rois.const_data_ptr<acc_t>(),
          levels_or_null(args.roi_levels), args.params, tiling, out.mutable_data_ptr<scalar_t>(),
          max_mode ? argmax.mutable_data_ptr<int32_t>() : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  batch_check.finish("roi_align", first.size(0));
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
    const int64_t channels = grad_output.size(1), num_bins = grad_output.size(2) * grad_output.size(3);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "roi_align_backward_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      with_packet_width<acc_t>(packet_width<acc_t>(buffers), [&](auto packet) {
        constexpr int V = decltype(packet)::value;
        const Tiling tiling = make_tiling(rois.size(0), channels, num_bins, V, sizeof(scalar_t), max_mode);
        const auto kernel = max_mode ? roi_align_backward_kernel<scalar_t, acc_t, V, true>
                                     : roi_align_backward_kernel<scalar_t, acc_t, V, false>;
        allow_shared_memory(kernel, tiling.shared_bytes);
        kernel<<<tiling.blocks, tiling.threads, tiling.shared_bytes, stream>>>(
            level_table<acc_t>(buffers, spatial_scales), args.rois.const_data_ptr<acc_t>(),
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
