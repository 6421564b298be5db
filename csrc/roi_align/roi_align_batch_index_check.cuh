// RoIAlign on the GPU: the check of the rois' batch indices, run on a side stream beside the pooling kernel.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>

#include <cuda/std/limits>
#include <cmath>
#include <cstdint>

#include "../common/cuda_primitives.cuh"
#include "roi_align.h"

namespace yolo_fastdetect {
namespace roi_align {

inline bool capturing_graph() {
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

}  // namespace roi_align
}  // namespace yolo_fastdetect
