// Letterbox preprocessing on the GPU: one launch per batch, images of any sizes, one thread per output pixel (all
// three channels).
//
// The grid is (pixels of the canvas, batch): a thread reads its image's row of the parameter table (the same row for
// the whole block, so one broadcast load), maps its canvas pixel to the resized image (or to the padding), computes
// its two column and two row taps itself (letterbox.h, the same code the CPU kernel runs), reads the 2x2 BGR source
// pixels and writes the R, G and B planes; consecutive threads write consecutive addresses of each plane.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "letterbox.h"

namespace yolo_fastdetect {
namespace letterbox {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;  // the batch runs along gridDim.y

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    letterbox_kernel(const uint8_t* __restrict__ images, const int64_t* __restrict__ image_params,
                     const scalar_t* __restrict__ value_table, scalar_t* __restrict__ out, const LetterboxShape shape) {
  const int64_t plane_size = shape.out_height * shape.out_width;
  const int64_t pixel = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (pixel >= plane_size) return;
  const int64_t batch = blockIdx.y;
  const ImageParams image = image_params_at(image_params, batch);
  const int64_t out_y = pixel / shape.out_width, out_x = pixel - out_y * shape.out_width;
  const int64_t y = out_y - image.pad_top, x = out_x - image.pad_left;

  uint8_t bgr[kChannels] = {kPaddingValue, kPaddingValue, kPaddingValue};
  if (y >= 0 && y < image.resized_height && x >= 0 && x < image.resized_width) {
    resized_pixel(images + image.offset, image.in_width * kChannels,
                  resize_tap(y, image.in_height, resize_scale(image.in_height, image.resized_height),
                             /*clamp_weights=*/false),
                  resize_tap(x, image.in_width, resize_scale(image.in_width, image.resized_width),
                             /*clamp_weights=*/true),
                  bgr);
  }
  scalar_t* out_pixel = out + batch * kChannels * plane_size + pixel;
#pragma unroll
  for (int channel = 0; channel < kChannels; ++channel)
    out_pixel[channel * plane_size] = value_table[bgr[kChannels - 1 - channel]];  // BGR -> RGB
}

void letterbox_cuda(const at::Tensor& images, const at::Tensor& image_params, const at::Tensor& value_table,
                    const at::Tensor& out) {
  const LetterboxShape shape = check_letterbox_args(images, image_params, value_table, out);
  TORCH_CHECK(images.is_cuda(), "letterbox: images must be a CUDA tensor");
  TORCH_CHECK_VALUE(shape.batch <= kMaxGridY, "letterbox: at most " + std::to_string(kMaxGridY) +
                                                  " images per call, got " + std::to_string(shape.batch));
  if (out.numel() == 0) return;
  const c10::cuda::CUDAGuard device_guard(images.device());
  const at::Tensor images_dense = images.contiguous(), table_dense = value_table.contiguous();
  // The table was checked on the host; the kernel reads its copy, uploaded on the current stream (without blocking
  // the host when the caller pinned it).
  const at::Tensor params_on_device =
      image_params.contiguous().to(at::TensorOptions().device(images.device()), /*non_blocking=*/true);

  const int64_t blocks = (shape.out_height * shape.out_width + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "letterbox: output too large for one launch");
  const dim3 grid(static_cast<unsigned int>(blocks), static_cast<unsigned int>(shape.batch));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, value_table.scalar_type(), "letterbox_cuda", [&] {
    letterbox_kernel<scalar_t><<<grid, kThreads, 0, stream>>>(
        images_dense.const_data_ptr<uint8_t>(), params_on_device.const_data_ptr<int64_t>(),
        table_dense.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), shape);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CUDA, m) { m.impl("letterbox", &letterbox_cuda); }

}  // namespace letterbox
}  // namespace yolo_fastdetect
