// Letterbox preprocessing on the GPU: one launch per batch, one thread per output pixel (all three channels).
//
// A thread maps its canvas pixel to the resized image (or to the padding), computes its two column and two row
// taps itself (letterbox.h, the same code the CPU kernel runs), reads the 2x2 BGR source pixels and writes the
// R, G and B planes; consecutive threads write consecutive addresses of each plane.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "letterbox.h"

namespace yolo_fastdetect {
namespace letterbox {
namespace {

constexpr int kThreads = 256;

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    letterbox_kernel(const uint8_t* __restrict__ images, const scalar_t* __restrict__ value_table,
                     scalar_t* __restrict__ out, const LetterboxShape shape) {
  const int64_t plane_size = shape.out_height * shape.out_width;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= shape.batch * plane_size) return;
  const int64_t batch = index / plane_size, pixel = index - batch * plane_size;
  const int64_t out_y = pixel / shape.out_width, out_x = pixel - out_y * shape.out_width;
  const int64_t y = out_y - shape.pad_top, x = out_x - shape.pad_left;

  uint8_t bgr[kChannels] = {kPaddingValue, kPaddingValue, kPaddingValue};
  if (y >= 0 && y < shape.resized_height && x >= 0 && x < shape.resized_width) {
    const int64_t row_stride = shape.in_width * kChannels;
    resized_pixel(images + batch * shape.in_height * row_stride, row_stride,
                  resize_tap(y, shape.in_height, shape.scale_y, /*clamp_weights=*/false),
                  resize_tap(x, shape.in_width, shape.scale_x, /*clamp_weights=*/true), bgr);
  }
  scalar_t* out_pixel = out + batch * kChannels * plane_size + pixel;
#pragma unroll
  for (int channel = 0; channel < kChannels; ++channel)
    out_pixel[channel * plane_size] = value_table[bgr[kChannels - 1 - channel]];  // BGR -> RGB
}

at::Tensor letterbox_cuda(const at::Tensor& images, const at::Tensor& value_table, int64_t resized_height,
                          int64_t resized_width, int64_t out_height, int64_t out_width, int64_t pad_top,
                          int64_t pad_left) {
  const LetterboxShape shape = check_letterbox_args(images, value_table, resized_height, resized_width, out_height,
                                                    out_width, pad_top, pad_left);
  TORCH_CHECK(images.is_cuda(), "letterbox: images must be a CUDA tensor");
  const c10::cuda::CUDAGuard device_guard(images.device());
  at::Tensor out = at::empty({shape.batch, kChannels, out_height, out_width}, value_table.options());
  if (out.numel() == 0) return out;
  const at::Tensor images_dense = images.contiguous(), table_dense = value_table.contiguous();

  const int64_t blocks = (shape.batch * out_height * out_width + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "letterbox: output too large for one launch");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, value_table.scalar_type(), "letterbox_cuda", [&] {
    letterbox_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(images_dense.const_data_ptr<uint8_t>(),
                                                                table_dense.const_data_ptr<scalar_t>(),
                                                                out.mutable_data_ptr<scalar_t>(), shape);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CUDA, m) { m.impl("letterbox", &letterbox_cuda); }

}  // namespace letterbox
}  // namespace yolo_fastdetect
