// YUV 4:2:0 to BGR24 on the GPU: one thread per output pixel, one launch for a frame or a batch of frames (the grid's
// second dimension).
//
// Consecutive threads take consecutive pixels of a row, so a warp reads 32 consecutive luma bytes (16 chroma samples
// of each plane) and writes 96 consecutive output bytes. The planes may be strided views (an NVDEC surface's pitch,
// the U and V halves of an interleaved NV12 plane).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "video_color.h"

namespace yolo_fastdetect {
namespace video_color {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    yuv420_to_bgr_kernel(const uint8_t* __restrict__ luma, const uint8_t* __restrict__ u, const uint8_t* __restrict__ v,
                         uint8_t* __restrict__ out, const PlaneLayout layout, const Coefficients k) {
  const int64_t pixel = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t frame_pixels = layout.height * layout.width;
  if (pixel >= frame_pixels) return;
  const int64_t frame = blockIdx.y;
  const int64_t row = pixel / layout.width, column = pixel - row * layout.width;
  convert_pixel(luma + frame * layout.luma_frame_stride, u + frame * layout.u_frame_stride,
                v + frame * layout.v_frame_stride, layout, k, row, column,
                out + (frame * frame_pixels + pixel) * kChannels);
}

at::Tensor yuv420_to_bgr_cuda(const at::Tensor& luma, const at::Tensor& chroma_u, const at::Tensor& chroma_v,
                              c10::IntArrayRef coefficients) {
  Coefficients k;
  const PlaneLayout layout = check_yuv420_to_bgr_args(luma, chroma_u, chroma_v, coefficients, k);
  TORCH_CHECK(luma.is_cuda(), "yuv420_to_bgr: luma must be a CUDA tensor");
  const c10::cuda::CUDAGuard device_guard(luma.device());
  at::Tensor out = empty_bgr(luma, layout);
  if (out.numel() == 0) return out;
  const int64_t blocks = (layout.height * layout.width + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "yuv420_to_bgr: frame too large for one launch");
  TORCH_CHECK_VALUE(layout.frames <= 65535, "yuv420_to_bgr: at most 65535 frames a call, got " + text(layout.frames));
  const dim3 grid(static_cast<unsigned int>(blocks), static_cast<unsigned int>(layout.frames));
  yuv420_to_bgr_kernel<<<grid, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      luma.const_data_ptr<uint8_t>(), chroma_u.const_data_ptr<uint8_t>(), chroma_v.const_data_ptr<uint8_t>(),
      out.mutable_data_ptr<uint8_t>(), layout, k);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CUDA, m) { m.impl("yuv420_to_bgr", &yuv420_to_bgr_cuda); }

}  // namespace video_color
}  // namespace yolo_fastdetect
