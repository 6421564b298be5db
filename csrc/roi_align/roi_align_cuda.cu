// RoIAlign on the GPU: forward and backward, one or several levels in one launch.
//
// Work split: a block owns one RoI, a chunk of kBinsPerBlock output bins and a chunk of kLanes channels. The lane
// of a thread is its channel and the warp picks the bin, so every bilinear tap of a warp reads (or, backward,
// atomically adds to) kLanes consecutive channels of one pixel: coalesced in channels-last (NHWC) memory. The
// launcher therefore hands the kernels NHWC features (converting NCHW ones) and accumulates gradients in an
// NHWC buffer. The sample geometry is warp-uniform, computed once per warp for all its channels.
// The (K, C, PH, PW) output is staged through shared memory so that each block writes (and, backward, reads)
// whole runs of consecutive bins instead of one element per channel plane.
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
#include <vector>

#include "roi_align.h"

namespace yolo_fastdetect {
namespace roi_align {
namespace {

constexpr int kLanes = 32;  // channels per block, one per lane of a warp
constexpr int kWarps = 8;
constexpr int kThreads = kLanes * kWarps;
constexpr int kBinsPerBlock = 64;  // 7x7 output: one bin chunk per RoI

// Block index -> (RoI, bin chunk, channel chunk), channel chunks fastest so neighbouring blocks share taps.
struct BlockWork {
  int64_t roi;
  int64_t first_bin;
  int num_bins;  // bins of this chunk
  int64_t first_channel;
};

__device__ __forceinline__ BlockWork block_work(int64_t num_bins, int64_t channel_chunks, int64_t bin_chunks) {
  const int64_t block = blockIdx.x;
  BlockWork work;
  const int64_t channel_chunk = block % channel_chunks;
  const int64_t bin_chunk = (block / channel_chunks) % bin_chunks;
  work.roi = block / (channel_chunks * bin_chunks);
  work.first_bin = bin_chunk * kBinsPerBlock;
  work.num_bins = static_cast<int>(min(static_cast<int64_t>(kBinsPerBlock), num_bins - work.first_bin));
  work.first_channel = channel_chunk * kLanes;
  return work;
}

// Padded by one column so that lanes (rows) writing the same bin hit different banks.
template <typename value_t>
using BinTile = value_t[kLanes][kBinsPerBlock + 1];

template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    roi_align_forward_kernel(const LevelTable<const scalar_t> levels, const acc_t* __restrict__ rois,
                             const int64_t* __restrict__ roi_levels, const PoolParams params,
                             const int64_t channel_chunks, const int64_t bin_chunks, scalar_t* __restrict__ out,
                             int32_t* __restrict__ argmax) {
  __shared__ BinTile<acc_t> value_tile;
  __shared__ BinTile<int32_t> argmax_tile;
  const int64_t num_bins = params.pooled_height * params.pooled_width;
  const BlockWork work = block_work(num_bins, channel_chunks, bin_chunks);
  const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
  const int64_t channels = levels.channels;
  const acc_t* roi = rois + 5 * work.roi;

  int level;
  int64_t batch_index;
  if (roi_source(roi, roi_levels, work.roi, levels, level, batch_index)) {
    const RoiBins<acc_t> bins = roi_bins(roi, static_cast<acc_t>(levels.spatial_scale[level]), params);
    const acc_t count = static_cast<acc_t>(max(bins.grid_h * bins.grid_w, 1));
    // Lanes past the last channel read the last one (in bounds, no divergence) and write nothing.
    const int64_t channel = min(work.first_channel + lane, channels - 1);
    const scalar_t* plane =
        levels.data[level] + batch_index * levels.stride_n[level] + channel * levels.stride_c[level];
    const int64_t height = levels.height[level], width = levels.width[level];
    for (int b = warp; b < work.num_bins; b += kWarps) {
      const int64_t bin = work.first_bin + b;
      const int64_t ph = bin / params.pooled_width, pw = bin - ph * params.pooled_width;
      acc_t sum = 0, best = -::cuda::std::numeric_limits<acc_t>::infinity();
      int32_t best_sample = -1;
      for (int iy = 0; iy < bins.grid_h; ++iy) {
        const AxisTaps<acc_t> y =
            axis_taps(sample_coordinate(bins.start_y, bins.bin_height, ph, iy, bins.grid_h), height);
        for (int ix = 0; ix < bins.grid_w; ++ix) {
          const AxisTaps<acc_t> x =
              axis_taps(sample_coordinate(bins.start_x, bins.bin_width, pw, ix, bins.grid_w), width);
          const acc_t value =
              interpolate(plane, point_taps(y, x, levels.stride_h[level], levels.stride_w[level]));
          if (params.max_mode) {
            if (value > best) best = value, best_sample = iy * bins.grid_w + ix;
          } else {
            sum += value;
          }
        }
      }
      value_tile[lane][b] = params.max_mode ? (best_sample >= 0 ? best : acc_t(0)) : sum / count;
      argmax_tile[lane][b] = best_sample;
    }
  } else {
    for (int b = warp; b < work.num_bins; b += kWarps) {
      value_tile[lane][b] = acc_t(0);
      argmax_tile[lane][b] = -1;
    }
  }
  __syncthreads();

  // Channel c of this block's RoI holds its bins contiguously: write runs of num_bins elements.
  for (int i = threadIdx.x; i < kLanes * work.num_bins; i += kThreads) {
    const int row = i / work.num_bins, b = i - row * work.num_bins;
    const int64_t channel = work.first_channel + row;
    if (channel >= channels) break;  // rows grow with i
    const int64_t index = (work.roi * channels + channel) * num_bins + work.first_bin + b;
    out[index] = static_cast<scalar_t>(value_tile[row][b]);
    if (argmax != nullptr) argmax[index] = argmax_tile[row][b];
  }
}

// grads: one NHWC buffer per level in the accumulation type; grad_output and argmax contiguous (K, C, PH, PW).
template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    roi_align_backward_kernel(const LevelTable<acc_t> grads, const acc_t* __restrict__ rois,
                              const int64_t* __restrict__ roi_levels, const PoolParams params,
                              const int64_t channel_chunks, const int64_t bin_chunks,
                              const scalar_t* __restrict__ grad_output, const int32_t* __restrict__ argmax) {
  __shared__ BinTile<acc_t> gradient_tile;
  __shared__ BinTile<int32_t> argmax_tile;
  const int64_t num_bins = params.pooled_height * params.pooled_width;
  const BlockWork work = block_work(num_bins, channel_chunks, bin_chunks);
  const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
  const int64_t channels = grads.channels;
  const acc_t* roi = rois + 5 * work.roi;

  int level;
  int64_t batch_index;
  if (!roi_source(roi, roi_levels, work.roi, grads, level, batch_index)) return;  // block-uniform

  for (int i = threadIdx.x; i < kLanes * work.num_bins; i += kThreads) {
    const int row = i / work.num_bins, b = i - row * work.num_bins;
    const int64_t channel = work.first_channel + row;
    if (channel >= channels) break;
    const int64_t index = (work.roi * channels + channel) * num_bins + work.first_bin + b;
    gradient_tile[row][b] = static_cast<acc_t>(grad_output[index]);
    argmax_tile[row][b] = argmax != nullptr ? argmax[index] : -1;
  }
  __syncthreads();

  const int64_t channel = work.first_channel + lane;
  if (channel >= channels) return;  // no __syncthreads() below
  const RoiBins<acc_t> bins = roi_bins(roi, static_cast<acc_t>(grads.spatial_scale[level]), params);
  const int num_samples = bins.grid_h * bins.grid_w;
  const acc_t count = static_cast<acc_t>(max(num_samples, 1));
  acc_t* plane = grads.data[level] + batch_index * grads.stride_n[level] + channel * grads.stride_c[level];
  const int64_t height = grads.height[level], width = grads.width[level];
  const int64_t stride_h = grads.stride_h[level], stride_w = grads.stride_w[level];
  auto scatter = [&](int64_t ph, int64_t pw, int iy, int ix, acc_t gradient) {
    const PointTaps<acc_t> taps =
        point_taps(axis_taps(sample_coordinate(bins.start_y, bins.bin_height, ph, iy, bins.grid_h), height),
                   axis_taps(sample_coordinate(bins.start_x, bins.bin_width, pw, ix, bins.grid_w), width),
                   stride_h, stride_w);
    if (!taps.valid) return;
#pragma unroll
    for (int tap = 0; tap < 4; ++tap) atomicAdd(plane + taps.offset[tap], taps.weight[tap] * gradient);
  };
  for (int b = warp; b < work.num_bins; b += kWarps) {
    const int64_t bin = work.first_bin + b;
    const int64_t ph = bin / params.pooled_width, pw = bin - ph * params.pooled_width;
    const acc_t gradient = gradient_tile[lane][b];
    if (params.max_mode) {
      const int32_t best_sample = argmax_tile[lane][b];
      if (best_sample >= 0 && best_sample < num_samples)
        scatter(ph, pw, best_sample / bins.grid_w, best_sample % bins.grid_w, gradient);
    } else {
      const acc_t share = gradient / count;
      for (int iy = 0; iy < bins.grid_h; ++iy)
        for (int ix = 0; ix < bins.grid_w; ++ix) scatter(ph, pw, iy, ix, share);
    }
  }
}

struct LaunchShape {
  int64_t blocks, channel_chunks, bin_chunks;
};

LaunchShape launch_shape(int64_t num_rois, int64_t channels, const PoolParams& params) {
  const int64_t num_bins = params.pooled_height * params.pooled_width;
  LaunchShape shape;
  shape.channel_chunks = (channels + kLanes - 1) / kLanes;
  shape.bin_chunks = (num_bins + kBinsPerBlock - 1) / kBinsPerBlock;
  shape.blocks = num_rois * shape.channel_chunks * shape.bin_chunks;
  TORCH_CHECK(shape.blocks < (int64_t{1} << 31), "roi_align: too many RoIs x channels x bins for one launch");
  return shape;
}

bool capturing_graph() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

std::tuple<at::Tensor, at::Tensor> multiscale_forward_cuda(at::TensorList features, const at::Tensor& rois,
                                                           const at::Tensor& roi_levels, int64_t pooled_height,
                                                           int64_t pooled_width, at::ArrayRef<double> spatial_scales,
                                                           int64_t sampling_ratio, bool aligned, bool max_mode) {
  TORCH_CHECK(!features.empty() && features[0].is_cuda(), "roi_align: features must be CUDA tensors");
  const c10::cuda::CUDAGuard device_guard(features[0].device());
  const CheckedArgs args = check_forward_args("roi_align", features, rois, roi_levels, pooled_height, pooled_width,
                                              spatial_scales, sampling_ratio, aligned, max_mode, !capturing_graph());
  const at::Tensor& first = features[0];
  const int64_t num_rois = rois.size(0), channels = first.size(1);
  at::Tensor out = at::empty({num_rois, channels, pooled_height, pooled_width}, first.options());
  at::Tensor argmax = at::empty(max_mode ? out.sizes() : at::IntArrayRef{0}, first.options().dtype(at::kInt));
  if (out.numel() == 0) return {out, argmax};

  // Channels-last makes the lanes' loads coalesced; maps already in that layout (or with unit channel stride,
  // e.g. a channels-last slice) are used in place.
  std::vector<at::Tensor> channels_last;
  for (const at::Tensor& map : features)
    channels_last.push_back(map.stride(1) == 1 ? map : map.contiguous(at::MemoryFormat::ChannelsLast));
  const LaunchShape shape = launch_shape(num_rois, channels, args.params);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, first.scalar_type(), "roi_align_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    roi_align_forward_kernel<scalar_t, acc_t><<<shape.blocks, kThreads, 0, stream>>>(
        level_table<const scalar_t>(channels_last, spatial_scales), args.rois.const_data_ptr<acc_t>(),
        args.roi_levels.defined() ? args.roi_levels.const_data_ptr<int64_t>() : nullptr, args.params,
        shape.channel_chunks, shape.bin_chunks, out.mutable_data_ptr<scalar_t>(),
        max_mode ? argmax.mutable_data_ptr<int32_t>() : nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
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
    const LaunchShape shape = launch_shape(rois.size(0), grad_output.size(1), args.params);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "roi_align_backward_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      roi_align_backward_kernel<scalar_t, acc_t><<<shape.blocks, kThreads, 0, stream>>>(
          level_table<acc_t>(buffers, spatial_scales), args.rois.const_data_ptr<acc_t>(),
          args.roi_levels.defined() ? args.roi_levels.const_data_ptr<int64_t>() : nullptr, args.params,
          shape.channel_chunks, shape.bin_chunks, grad_contiguous.const_data_ptr<scalar_t>(),
          max_mode ? argmax_contiguous.const_data_ptr<int32_t>() : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  // One transposing (and, for 16-bit types, casting) copy per level into the contiguous (N, C, H, W) result.
  std::vector<at::Tensor> grads;
  for (const at::Tensor& buffer : buffers)
    grads.push_back(at::empty(buffer.sizes(), buffer.options().dtype(dtype)).copy_(buffer));
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
