// Letterbox preprocessing: per-pixel math shared by the CPU and CUDA kernels.
//
// A batch of uint8 BGR images of any sizes, packed back to back in one flat buffer (each (H, W, 3) row-major), is
// described by a per-image parameter table (ImageParams). Each image is resized to its (resized_height,
// resized_width) with cv::resize's INTER_LINEAR arithmetic on 8-bit data, placed at its (pad_top, pad_left) on the
// batch's common (out_height, out_width) canvas of 114, and written as (B, 3, out_height, out_width) RGB through a
// 256-entry value table (the model dtype's value of u / 255 for every byte u, computed by torch on the target
// device, so the result equals stock Ultralytics' `.half()/.float()` followed by `.div_(255)` bit for bit).
//
// cv::resize (INTER_LINEAR, 8-bit, OpenCV 4.x/5.x generic path, checked against the cv2 that Ultralytics
// installs on every size the tests draw):
//   - source coordinate of output index d: float((d + 0.5) * scale - 0.5) with scale = 1 / (dst / src) in double;
//     taps floor(coordinate) and floor + 1 with 11-bit weights round((1 - f) * 2048), round(f * 2048), f the
//     fractional part, rounded half to even;
//   - horizontally, a tap left of 0 or right of the last column takes the edge column with weight 2048;
//     vertically, the weights are kept and only the row indices are clamped;
//   - horizontal pass in exact integers: row = p0 * a0 + p1 * a1;
//   - vertical pass as OpenCV's vectorised code rounds it (every element of a row, tails included, in the cv2
//     builds checked; the exact formula (row0 * b0 + row1 * b1 + 2^21) >> 22 differs by one in a few pixels):
//     ((((row0 >> 4) * b0) >> 16) + (((row1 >> 4) * b1) >> 16) + 2) >> 2, saturated to [0, 255].
// An unchanged size (scale 1) reproduces the input exactly, which is what LetterBox's "no resize" branch does.
#pragma once

#include <cmath>
#include <cstdint>

#include <ATen/core/Tensor.h>

#include "../common.h"

namespace yolo_fastdetect {
namespace letterbox {

constexpr int kChannels = 3;
constexpr int kResizeCoefScale = 1 << 11;  // INTER_RESIZE_COEF_SCALE
constexpr uint8_t kPaddingValue = 114;

// The two source indices of one output index along one axis and their 11-bit weights.
struct Tap {
  int64_t low, high;
  int32_t weight_low, weight_high;
};

// Columns of the (B, kParamCount) int64 image_params table: where image b lies in the packed buffer and where
// it lands on the canvas.
enum ImageParam : int {
  kOffset = 0,  // byte offset of the image in the packed buffer
  kInHeight,    // original size
  kInWidth,
  kResizedHeight,  // size after the resize (LetterBox's new_unpad, reversed)
  kResizedWidth,
  kPadTop,  // placement of the resized image on the canvas
  kPadLeft,
  kParamCount
};

// One image of the batch, read from its row of image_params.
struct ImageParams {
  int64_t offset;
  int64_t in_height, in_width;
  int64_t resized_height, resized_width;
  int64_t pad_top, pad_left;
};

// Geometry of one call: the batch size and the canvas that every image shares.
struct LetterboxShape {
  int64_t batch;
  int64_t out_height, out_width;
};

YFD_HOST_DEVICE ImageParams image_params_at(const int64_t* table, int64_t image) {
  const int64_t* row = table + image * kParamCount;
  ImageParams params;
  params.offset = row[kOffset];
  params.in_height = row[kInHeight];
  params.in_width = row[kInWidth];
  params.resized_height = row[kResizedHeight];
  params.resized_width = row[kResizedWidth];
  params.pad_top = row[kPadTop];
  params.pad_left = row[kPadLeft];
  return params;
}

// Source pixels per resized pixel along one axis, as cv::resize computes it: the inverse of the double ratio
// resized / input (IEEE division on both devices, so both get the same double).
YFD_HOST_DEVICE double resize_scale(int64_t src_size, int64_t resized_size) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(1.0, __ddiv_rn(static_cast<double>(resized_size), static_cast<double>(src_size)));
#else
  return 1.0 / (static_cast<double>(resized_size) / static_cast<double>(src_size));
#endif
}

YFD_HOST_DEVICE int32_t round_half_even(float x) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(x);
#else
  return static_cast<int32_t>(std::nearbyint(x));  // the default rounding mode: to nearest, ties to even
#endif
}

// `clamp_weights`: the horizontal pass moves an out-of-range tap onto the edge pixel with full weight; the
// vertical pass keeps the weights and clamps only the row indices (both as cv::resize).
YFD_HOST_DEVICE Tap resize_tap(int64_t index, int64_t src_size, double scale, bool clamp_weights) {
  // Rounded after the multiplication and after the subtraction, never fused: the CPU build has contraction
  // off (-ffp-contract=off), the GPU one says so explicitly.
#if defined(__CUDA_ARCH__)
  const float coordinate = __double2float_rn(__dsub_rn(__dmul_rn(static_cast<double>(index) + 0.5, scale), 0.5));
#else
  const float coordinate = static_cast<float>((static_cast<double>(index) + 0.5) * scale - 0.5);
#endif
  const float floor_coordinate = floorf(coordinate);
  int64_t low = static_cast<int64_t>(floor_coordinate);
  float fraction = coordinate - floor_coordinate;
  if (clamp_weights) {
    if (low < 0) low = 0, fraction = 0.f;
    if (low >= src_size - 1) low = src_size - 1, fraction = 0.f;
  }
  Tap tap;
  tap.low = low < 0 ? 0 : (low > src_size - 1 ? src_size - 1 : low);
  tap.high = low + 1 < 0 ? 0 : (low + 1 > src_size - 1 ? src_size - 1 : low + 1);
  tap.weight_low = round_half_even((1.f - fraction) * static_cast<float>(kResizeCoefScale));
  tap.weight_high = round_half_even(fraction * static_cast<float>(kResizeCoefScale));
  return tap;
}

// Horizontal pass of one channel: exact, at most 255 * 2 * 2048.
YFD_HOST_DEVICE int32_t horizontal(const uint8_t* row, const Tap& x, int channel) {
  return static_cast<int32_t>(row[x.low * kChannels + channel]) * x.weight_low +
         static_cast<int32_t>(row[x.high * kChannels + channel]) * x.weight_high;
}

// Vertical pass, rounded as OpenCV's SIMD code: each row keeps the high 16 bits of (row >> 4) * weight
// (v_mul_hi on int16), then the sum is shifted right by 2 with rounding and saturated to uint8.
YFD_HOST_DEVICE uint8_t vertical(int32_t row0, int32_t row1, const Tap& y) {
  const int32_t sum = (((row0 >> 4) * y.weight_low) >> 16) + (((row1 >> 4) * y.weight_high) >> 16);
  const int32_t value = (sum + 2) >> 2;
  return static_cast<uint8_t>(value < 0 ? 0 : (value > 255 ? 255 : value));
}

// The resized BGR pixel at taps (y, x) of `image` (H, W, 3 contiguous, row_stride = W * 3).
YFD_HOST_DEVICE void resized_pixel(const uint8_t* image, int64_t row_stride, const Tap& y, const Tap& x,
                                   uint8_t (&bgr)[kChannels]) {
  const uint8_t* row0 = image + y.low * row_stride;
  const uint8_t* row1 = image + y.high * row_stride;
#pragma unroll
  for (int channel = 0; channel < kChannels; ++channel)
    bgr[channel] = vertical(horizontal(row0, x, channel), horizontal(row1, x, channel), y);
}

// Validates the operator's arguments (raising errors that name the argument), including that every image's bytes
// lie inside `images` and that its resized image fits the canvas, so the kernels never read or write out of
// bounds. Defined in letterbox_cpu.cpp, used by both launchers.
LetterboxShape check_letterbox_args(const at::Tensor& images, const at::Tensor& image_params,
                                    const at::Tensor& value_table, const at::Tensor& out);

}  // namespace letterbox
}  // namespace yolo_fastdetect
