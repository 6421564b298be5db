// FPN level of each RoI on the GPU: one thread per RoI, one launch.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "fpn_levels.h"

namespace yolo_fastdetect {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // more RoIs than kThreads * kMaxBlocks loop over the grid

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    fpn_levels_kernel(const scalar_t* __restrict__ rois, int64_t* __restrict__ levels, const FpnRoiLayout layout,
                      const FpnThresholds thresholds) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < layout.count; k += step)
    levels[k] = roi_fpn_level(rois, layout, k, thresholds);
}

at::Tensor fpn_levels_cuda(const at::Tensor& rois, int64_t lowest_level, int64_t num_levels, double canonical_size,
                           int64_t canonical_level, double eps) {
  FpnThresholds thresholds;
  FpnRoiLayout layout;
  check_fpn_levels_args(rois, lowest_level, num_levels, canonical_size, canonical_level, eps, thresholds, layout);
  TORCH_CHECK(rois.is_cuda(), "fpn_levels: rois must be a CUDA tensor");
  const c10::cuda::CUDAGuard device_guard(rois.device());
  at::Tensor levels = at::empty({layout.count}, rois.options().dtype(at::kLong));
  if (layout.count == 0) return levels;

  const int64_t blocks = std::min<int64_t>((layout.count + kThreads - 1) / kThreads, kMaxBlocks);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rois.scalar_type(), "fpn_levels_cuda", [&] {
    fpn_levels_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        rois.const_data_ptr<scalar_t>(), levels.mutable_data_ptr<int64_t>(), layout, thresholds);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return levels;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CUDA, m) { m.impl("fpn_levels", &fpn_levels_cuda); }

}  // namespace yolo_fastdetect
