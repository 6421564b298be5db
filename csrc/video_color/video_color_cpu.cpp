// YUV 4:2:0 to BGR24 on the CPU (rows in parallel, of one frame or a batch), and the argument checks and output
// shared with the CUDA launcher.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "video_color.h"

namespace yolo_fastdetect {
namespace video_color {
namespace {

void check_plane(const at::Tensor& plane, const char* name) {
  TORCH_CHECK_TYPE(plane.scalar_type() == at::kByte,
                   std::string("yuv420_to_bgr: ") + name + " must be uint8, got " + c10::toString(plane.scalar_type()));
  TORCH_CHECK_VALUE(plane.dim() == 2 || plane.dim() == 3,
                    std::string("yuv420_to_bgr: ") + name +
                        " must be 2-D (rows, columns) or 3-D (frames, rows, columns), got " + text(plane.sizes()));
}

}  // namespace

PlaneLayout check_yuv420_to_bgr_args(const at::Tensor& luma, const at::Tensor& chroma_u, const at::Tensor& chroma_v,
                                     c10::IntArrayRef coefficients, Coefficients& k) {
  check_plane(luma, "luma");
  check_plane(chroma_u, "chroma_u");
  check_plane(chroma_v, "chroma_v");
  TORCH_CHECK(chroma_u.device() == luma.device() && chroma_v.device() == luma.device(),
              "yuv420_to_bgr: luma, chroma_u and chroma_v must be on one device");
  const bool batched = luma.dim() == 3;
  TORCH_CHECK_VALUE(chroma_u.dim() == luma.dim() && chroma_v.dim() == luma.dim() &&
                        (!batched || (chroma_u.size(0) == luma.size(0) && chroma_v.size(0) == luma.size(0))),
                    "yuv420_to_bgr: chroma_u and chroma_v must have the luma's dimensions and frames, got luma " +
                        text(luma.sizes()) + ", chroma_u " + text(chroma_u.sizes()) + ", chroma_v " +
                        text(chroma_v.sizes()));
  const int64_t first = batched ? 1 : 0;  // the first dimension of a frame's rows and columns
  const int64_t height = luma.size(first), width = luma.size(first + 1);
  const int64_t chroma_height = (height + 1) / 2, chroma_width = (width + 1) / 2;
  const std::string chroma_shape = "[" + text(chroma_height) + ", " + text(chroma_width) + "]";
  TORCH_CHECK_VALUE(chroma_u.size(first) == chroma_height && chroma_u.size(first + 1) == chroma_width,
                    "yuv420_to_bgr: chroma_u must be " + chroma_shape + " (half the luma's " + text(luma.sizes()) +
                        ", rounded up), got " + text(chroma_u.sizes()));
  TORCH_CHECK_VALUE(chroma_v.size(first) == chroma_height && chroma_v.size(first + 1) == chroma_width,
                    "yuv420_to_bgr: chroma_v must be " + chroma_shape + " (half the luma's " + text(luma.sizes()) +
                        ", rounded up), got " + text(chroma_v.sizes()));
  TORCH_CHECK_VALUE(static_cast<int64_t>(coefficients.size()) == kCoefficientCount,
                    "yuv420_to_bgr: coefficients must hold " + text(kCoefficientCount) +
                        " values [y_offset, y_coeff, v2r, u2g, v2g, u2b], got " + text(coefficients.size()));
  for (const int64_t value : coefficients)
    TORCH_CHECK_VALUE(value >= INT16_MIN && value <= INT16_MAX,
                      "yuv420_to_bgr: coefficients must be 16-bit values (swscale's), got " + text(coefficients));
  k = {static_cast<int32_t>(coefficients[0]), static_cast<int32_t>(coefficients[1]),
       static_cast<int32_t>(coefficients[2]), static_cast<int32_t>(coefficients[3]),
       static_cast<int32_t>(coefficients[4]), static_cast<int32_t>(coefficients[5])};
  return {batched ? luma.size(0) : 1,
          batched ? luma.stride(0) : 0,
          batched ? chroma_u.stride(0) : 0,
          batched ? chroma_v.stride(0) : 0,
          height,
          width,
          luma.stride(first),
          luma.stride(first + 1),
          chroma_u.stride(first),
          chroma_u.stride(first + 1),
          chroma_v.stride(first),
          chroma_v.stride(first + 1)};
}

at::Tensor empty_bgr(const at::Tensor& luma, const PlaneLayout& layout) {
  if (luma.dim() == 3) return at::empty({layout.frames, layout.height, layout.width, kChannels}, luma.options());
  return at::empty({layout.height, layout.width, kChannels}, luma.options());
}

namespace {

constexpr int64_t kPixelsPerTask = 1 << 16;

at::Tensor yuv420_to_bgr_cpu(const at::Tensor& luma, const at::Tensor& chroma_u, const at::Tensor& chroma_v,
                             c10::IntArrayRef coefficients) {
  Coefficients k;
  const PlaneLayout layout = check_yuv420_to_bgr_args(luma, chroma_u, chroma_v, coefficients, k);
  at::Tensor out = empty_bgr(luma, layout);
  if (out.numel() == 0) return out;
  const uint8_t* luma_ptr = luma.const_data_ptr<uint8_t>();
  const uint8_t* u_ptr = chroma_u.const_data_ptr<uint8_t>();
  const uint8_t* v_ptr = chroma_v.const_data_ptr<uint8_t>();
  uint8_t* out_ptr = out.mutable_data_ptr<uint8_t>();
  const int64_t rows_per_task = std::max<int64_t>(1, kPixelsPerTask / layout.width);
  // The rows of every frame, one after another (the output is contiguous).
  at::parallel_for(0, layout.frames * layout.height, rows_per_task, [&](int64_t begin, int64_t end) {
    for (int64_t frame_row = begin; frame_row < end; ++frame_row) {
      const int64_t frame = frame_row / layout.height, row = frame_row - frame * layout.height;
      uint8_t* out_row = out_ptr + frame_row * layout.width * kChannels;
      for (int64_t column = 0; column < layout.width; ++column)
        convert_pixel(luma_ptr + frame * layout.luma_frame_stride, u_ptr + frame * layout.u_frame_stride,
                      v_ptr + frame * layout.v_frame_stride, layout, k, row, column, out_row + column * kChannels);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU, m) { m.impl("yuv420_to_bgr", &yuv420_to_bgr_cpu); }

}  // namespace video_color
}  // namespace yolo_fastdetect
