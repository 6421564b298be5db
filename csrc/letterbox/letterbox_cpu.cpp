// Letterbox preprocessing on the CPU, and the argument checks shared with the CUDA launcher.
//
// Rows of the output canvas run in parallel; the taps of every resized column and row are computed once per call.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "letterbox.h"

namespace yolo_fastdetect {
namespace letterbox {

LetterboxShape check_letterbox_args(const at::Tensor& images, const at::Tensor& value_table, int64_t resized_height,
                                    int64_t resized_width, int64_t out_height, int64_t out_width, int64_t pad_top,
                                    int64_t pad_left) {
  TORCH_CHECK_VALUE(images.dim() == 4 && images.size(3) == kChannels,
                    "letterbox: images must be (B, H, W, 3) BGR, got shape ", text(images.sizes()));
  TORCH_CHECK_TYPE(images.scalar_type() == at::kByte, "letterbox: images must be uint8, got ", images.scalar_type());
  TORCH_CHECK_VALUE(images.size(1) > 0 && images.size(2) > 0, "letterbox: images must be at least 1x1, got ",
                    text(images.size(1)), "x", text(images.size(2)));
  TORCH_CHECK_VALUE(value_table.dim() == 1 && value_table.size(0) == 256,
                    "letterbox: value_table must hold 256 values (one per byte), got shape ",
                    text(value_table.sizes()));
  const at::ScalarType dtype = value_table.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
                   "letterbox: value_table must be float32, float16 or bfloat16, got ", dtype);
  TORCH_CHECK(value_table.device() == images.device(), "letterbox: value_table is on ", value_table.device(),
              " but images is on ", images.device());
  TORCH_CHECK_VALUE(resized_height > 0 && resized_width > 0, "letterbox: resized size must be positive, got ",
                    text(resized_height), "x", text(resized_width));
  TORCH_CHECK_VALUE(pad_top >= 0 && pad_left >= 0, "letterbox: pad_top and pad_left must be >= 0, got ",
                    text(pad_top), ", ", text(pad_left));
  TORCH_CHECK_VALUE(pad_top + resized_height <= out_height && pad_left + resized_width <= out_width,
                    "letterbox: the resized image (", text(resized_height), "x", text(resized_width), " at top ",
                    text(pad_top), ", left ", text(pad_left), ") does not fit the output size ", text(out_height), "x",
                    text(out_width));

  LetterboxShape shape;
  shape.batch = images.size(0);
  shape.in_height = images.size(1);
  shape.in_width = images.size(2);
  shape.resized_height = resized_height;
  shape.resized_width = resized_width;
  shape.out_height = out_height;
  shape.out_width = out_width;
  shape.pad_top = pad_top;
  shape.pad_left = pad_left;
  // As cv::resize: the inverse of the double ratio resized / input.
  shape.scale_y = 1.0 / (static_cast<double>(resized_height) / static_cast<double>(shape.in_height));
  shape.scale_x = 1.0 / (static_cast<double>(resized_width) / static_cast<double>(shape.in_width));
  return shape;
}

namespace {

// One task per output row of one image: the three planes of that row, padding included.
template <typename scalar_t>
void letterbox_cpu_kernel(const uint8_t* images, const scalar_t* value_table, scalar_t* out,
                          const LetterboxShape& shape) {
  std::vector<Tap> column_taps(shape.resized_width), row_taps(shape.resized_height);
  for (int64_t x = 0; x < shape.resized_width; ++x)
    column_taps[x] = resize_tap(x, shape.in_width, shape.scale_x, /*clamp_weights=*/true);
  for (int64_t y = 0; y < shape.resized_height; ++y)
    row_taps[y] = resize_tap(y, shape.in_height, shape.scale_y, /*clamp_weights=*/false);

  const int64_t row_stride = shape.in_width * kChannels;
  const int64_t image_size = shape.in_height * row_stride;
  const int64_t plane_size = shape.out_height * shape.out_width;
  const scalar_t padding = value_table[kPaddingValue];
  at::parallel_for(0, shape.batch * shape.out_height, 16, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t batch = task / shape.out_height, out_y = task % shape.out_height;
      scalar_t* planes[kChannels];  // R, G, B rows of this output row
      for (int channel = 0; channel < kChannels; ++channel)
        planes[channel] = out + (batch * kChannels + channel) * plane_size + out_y * shape.out_width;
      const int64_t y = out_y - shape.pad_top;
      if (y < 0 || y >= shape.resized_height) {
        for (int channel = 0; channel < kChannels; ++channel)
          std::fill(planes[channel], planes[channel] + shape.out_width, padding);
        continue;
      }
      const int64_t right = shape.pad_left + shape.resized_width;
      for (int channel = 0; channel < kChannels; ++channel) {
        std::fill(planes[channel], planes[channel] + shape.pad_left, padding);
        std::fill(planes[channel] + right, planes[channel] + shape.out_width, padding);
      }
      const uint8_t* image = images + batch * image_size;
      const Tap& row_tap = row_taps[y];
      for (int64_t x = 0; x < shape.resized_width; ++x) {
        uint8_t bgr[kChannels];
        resized_pixel(image, row_stride, row_tap, column_taps[x], bgr);
        for (int channel = 0; channel < kChannels; ++channel)
          planes[channel][shape.pad_left + x] = value_table[bgr[kChannels - 1 - channel]];
      }
    }
  });
}

at::Tensor letterbox_cpu(const at::Tensor& images, const at::Tensor& value_table, int64_t resized_height,
                         int64_t resized_width, int64_t out_height, int64_t out_width, int64_t pad_top,
                         int64_t pad_left) {
  const LetterboxShape shape = check_letterbox_args(images, value_table, resized_height, resized_width, out_height,
                                                    out_width, pad_top, pad_left);
  at::Tensor out = at::empty({shape.batch, kChannels, out_height, out_width}, value_table.options());
  if (out.numel() == 0) return out;
  const at::Tensor images_dense = images.contiguous(), table_dense = value_table.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, value_table.scalar_type(), "letterbox_cpu", [&] {
    letterbox_cpu_kernel<scalar_t>(images_dense.const_data_ptr<uint8_t>(), table_dense.const_data_ptr<scalar_t>(),
                                   out.mutable_data_ptr<scalar_t>(), shape);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU, m) { m.impl("letterbox", &letterbox_cpu); }

}  // namespace letterbox
}  // namespace yolo_fastdetect
