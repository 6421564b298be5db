// YUV 4:2:0 (8-bit) to BGR24 as OpenCV's video reader converts it on x86: FFmpeg swscale's unscaled yuv2rgb
// converter, whose SSSE3/AVX2 code computes in 16-bit fixed point (libswscale/x86/yuv_2_rgb.asm):
//
//   y' = ((8 * Y - y_offset) * y_coeff) >> 16          (pmulhw: the high half of the signed product, floored)
//   B  = clamp(y' + ((8 * U - 1024) * u2b) >> 16)
//   G  = clamp(y' + ((8 * U - 1024) * u2g) >> 16 + ((8 * V - 1024) * v2g) >> 16)
//   R  = clamp(y' + ((8 * V - 1024) * v2r) >> 16)
//
// Each chroma sample serves its 2x2 block of pixels (no interpolation). The six coefficients are swscale's, from the
// stream's colour matrix and range (yolo_fastdetect/ops/video_color.py computes them). No intermediate reaches the
// int16 saturation of the SIMD adds for 8-bit input, so plain int arithmetic gives the same bytes.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "../common.h"

namespace yolo_fastdetect {
namespace video_color {

constexpr int kChannels = 3;
constexpr int64_t kCoefficientCount = 6;
constexpr int kChromaOffset = 128 << 3;  // swscale's uOffset / vOffset: 128 in the << 3 scale

// swscale's per-context constants, in the order of the operator's `coefficients` argument.
struct Coefficients {
  int32_t y_offset;
  int32_t y_coeff;
  int32_t v2r;
  int32_t u2g;
  int32_t v2g;
  int32_t u2b;
};

// The frames' count and size, and the element strides of the three planes (between frames: 0 for a single frame).
// Chroma plane (r, c) serves pixels (2r..2r+1, 2c..2c+1).
struct PlaneLayout {
  int64_t frames;
  int64_t luma_frame_stride;
  int64_t u_frame_stride;
  int64_t v_frame_stride;
  int64_t height;
  int64_t width;
  int64_t luma_row_stride;
  int64_t luma_column_stride;
  int64_t u_row_stride;
  int64_t u_column_stride;
  int64_t v_row_stride;
  int64_t v_column_stride;
};

// pmulhw: the high 16 bits of the signed 32-bit product. The shift of a negative product floors (arithmetic shift).
YFD_HOST_DEVICE int32_t multiply_high(int32_t value, int32_t coefficient) { return (value * coefficient) >> 16; }

YFD_HOST_DEVICE uint8_t clamp_byte(int32_t value) {
  return static_cast<uint8_t>(value < 0 ? 0 : (value > 255 ? 255 : value));
}

// The B, G, R bytes of one pixel from its luma and chroma samples.
YFD_HOST_DEVICE void yuv_to_bgr(uint8_t luma, uint8_t u, uint8_t v, const Coefficients& k, uint8_t* bgr) {
  const int32_t y = multiply_high((int32_t{luma} << 3) - k.y_offset, k.y_coeff);
  const int32_t u_scaled = (int32_t{u} << 3) - kChromaOffset, v_scaled = (int32_t{v} << 3) - kChromaOffset;
  bgr[0] = clamp_byte(y + multiply_high(u_scaled, k.u2b));
  bgr[1] = clamp_byte(y + (multiply_high(u_scaled, k.u2g) + multiply_high(v_scaled, k.v2g)));
  bgr[2] = clamp_byte(y + multiply_high(v_scaled, k.v2r));
}

// Pixel (row, column) of the frame converted into out_pixel[0..2].
YFD_HOST_DEVICE void convert_pixel(const uint8_t* luma, const uint8_t* u, const uint8_t* v, const PlaneLayout& layout,
                                   const Coefficients& k, int64_t row, int64_t column, uint8_t* out_pixel) {
  const int64_t chroma_row = row >> 1, chroma_column = column >> 1;
  yuv_to_bgr(luma[row * layout.luma_row_stride + column * layout.luma_column_stride],
             u[chroma_row * layout.u_row_stride + chroma_column * layout.u_column_stride],
             v[chroma_row * layout.v_row_stride + chroma_column * layout.v_column_stride], k, out_pixel);
}

// Checks the planes (each 2-D (rows, columns), or all 3-D (frames, rows, columns)) and coefficients (names in the
// messages are the operator's arguments) and returns the layout and coefficients; shared by the CPU and CUDA
// launchers (video_color_cpu.cpp).
PlaneLayout check_yuv420_to_bgr_args(const at::Tensor& luma, const at::Tensor& chroma_u, const at::Tensor& chroma_v,
                                     c10::IntArrayRef coefficients, Coefficients& k);

// The operator's output for `layout`: (H, W, 3) for 2-D planes, (frames, H, W, 3) for 3-D ones.
at::Tensor empty_bgr(const at::Tensor& luma, const PlaneLayout& layout);

}  // namespace video_color
}  // namespace yolo_fastdetect
