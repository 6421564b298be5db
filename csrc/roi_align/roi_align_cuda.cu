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
//
// The pieces, each in its file: roi_align_tiling.cuh (the launch's split of the work, a block's RoI and tiles),
// roi_align_taps.cuh (the tap tables and the sample loops), roi_align_relayout.cuh (NCHW <-> NHWC),
// roi_align_batch_index_check.cuh (the rois' batch indices, checked beside the pooling kernel) and
// ../common/cuda_primitives.cuh (packets, cache-hinted loads and stores, vector atomics, programmatic dependent
// launch). This file holds the kernels and their launchers.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "../common/cuda_primitives.cuh"
#include "roi_align.h"
#include "roi_align_batch_index_check.cuh"
#include "roi_align_relayout.cuh"
#include "roi_align_taps.cuh"
#include "roi_align_tiling.cuh"

namespace yolo_fastdetect {
namespace roi_align {
namespace {

// Bytes of channels a lane pools (one 16-byte load per tap, forward; a float4 atomic, backward), and of the vectors
// of the transposes. Wider forward packets for 16-bit maps (two loads per tap, 16 channels a lane) measured slower
// once a bin's taps were merged (benchmarks/RESULTS.md, RoIAlign: the (4, 256, 80, 80) float16 case).
constexpr int kPacketBytes = 16;

// p, held by the compiler as one 64-bit register. A lane's base address (map + image + channel offsets) would
// otherwise be re-added to every tap's 32-bit offset in 64-bit arithmetic: four instructions per load instead of one.
template <typename T>
__device__ __forceinline__ T* opaque_pointer(T* p) {
  asm("" : "+l"(p));
  return p;
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
                              plane_shape(levels, level), params, tiling.tap_tables, shared_memory);
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
    roi_align_backward_kernel(const LevelTable<acc_t> grads, const RoiRows rois, const int64_t* __restrict__ roi_levels,
                              const PoolParams params, const Tiling tiling, const scalar_t* __restrict__ grad_output,
                              const int32_t* __restrict__ argmax) {
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
                            plane_shape(grads, level), params, tiling.tap_tables, shared_memory);
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
          const auto taps = point_taps(grid.template y_taps<kTabulated>(ph, iy),
                                       grid.template x_taps<kTabulated>(pw, best_sample - iy * grid.bins.grid_w));
          if (!taps.valid) continue;
          const acc_t gradient = static_cast<acc_t>(lane_gradients[v * tiling.bins_per_block + b]);
#pragma unroll
          for (int tap = 0; tap < 4; ++tap) atomicAdd(lane_image + taps.offset[tap] + v, taps.weight[tap] * gradient);
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
                                       : relayout<kPacketBytes, scalar_t, scalar_t>(
                                             map, map.scalar_type(), at::MemoryFormat::ChannelsLast, stream));
    }
    std::tie(out, argmax) = pooled_outputs();
    const int width = packet_width<kPacketBytes, scalar_t>(channels_last);
    with_packet_width<kPacketBytes, scalar_t>(width, [&](auto packet) {
      constexpr int V = decltype(packet)::value;
      const Tiling tiling =
          make_tiling(channels_last, num_rois, channels, args.params, V, sizeof(scalar_t), kTapTableBytes<acc_t>);
      // Avg and max mode are separate kernels: max mode's per-channel argmax state would cost avg mode registers.
      const auto kernel = max_mode
                              ? (tiling.all_tabulated ? roi_align_forward_kernel<scalar_t, acc_t, V, true, true>
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
        const Tiling tiling =
            make_tiling(buffers, rois.size(0), channels, args.params, V, sizeof(scalar_t), kTapTableBytes<acc_t>);
        const auto kernel = max_mode ? roi_align_backward_kernel<scalar_t, acc_t, V, true>
                                     : roi_align_backward_kernel<scalar_t, acc_t, V, false>;
        allow_shared_memory(kernel, tiling.shared_bytes);
        kernel<<<tiling.blocks, tiling.threads, tiling.shared_bytes, stream>>>(
            level_table<acc_t>(buffers, spatial_scales), roi_rows(rois), levels_or_null(args.roi_levels), args.params,
            tiling, grad_contiguous.const_data_ptr<scalar_t>(),
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
      grads.push_back(relayout<kPacketBytes, acc_t, scalar_t>(buffer, dtype, at::MemoryFormat::Contiguous,
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
  return multiscale_backward_cuda(grad_output, rois, at::Tensor(), argmax, input_shape, {spatial_scale}, sampling_ratio,
                                  aligned, max_mode)[0];
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
