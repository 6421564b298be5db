// Letterbox preprocessing on the CPU, and the argument checks shared with the CUDA launcher.
//
// Rows of the output canvas run in parallel; the taps of every image's resized columns and rows are computed once
// per call.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <vector>

#include "letterbox.h"

namespace yolo_fastdetect {
namespace letterbox {

// Error messages format numbers with std::to_string and never stream them (c10::str): iostream number formatting
// has crashed inside the operator on the GPU machine.
namespace {

std::string dtype_name(const at::Tensor& tensor) { return c10::toString(tensor.scalar_type()); }

// "(2, 3)": a shape formatted with std::to_string.
std::string shape_string(const at::Tensor& tensor) {
  std::string text = "(";
  for (int64_t dim = 0; dim < tensor.dim(); ++dim) text += (dim ? ", " : "") + std::to_string(tensor.size(dim));
  return text + ")";
}

// Checks one row of image_params against the packed buffer of `packed_size` bytes and the canvas.
void check_image(const ImageParams& image, int64_t index, int64_t packed_size, const LetterboxShape& shape) {
  const std::string where = "letterbox: image_params row " + std::to_string(index) + ": ";
  TORCH_CHECK_VALUE(image.in_height > 0 && image.in_width > 0, where + "the image must be at least 1x1, got " +
                                                                   std::to_string(image.in_height) + "x" +
                                                                   std::to_string(image.in_width));
  // Written so that nothing overflows: offset, height and width are each bounded before they are multiplied.
  const int64_t available = image.offset >= 0 && image.offset <= packed_size ? packed_size - image.offset : -1;
  TORCH_CHECK_VALUE(available >= 0 && image.in_width <= available / kChannels &&
                        image.in_height <= available / (image.in_width * kChannels),
                    where + "the " + std::to_string(image.in_height) + "x" + std::to_string(image.in_width) +
                        " image at byte offset " + std::to_string(image.offset) + " does not lie inside images (" +
                        std::to_string(packed_size) + " bytes)");
  TORCH_CHECK_VALUE(image.resized_height > 0 && image.resized_width > 0,
                    where + "the resized size must be positive, got " + std::to_string(image.resized_height) + "x" +
                        std::to_string(image.resized_width));
  TORCH_CHECK_VALUE(image.pad_top >= 0 && image.pad_left >= 0, where + "pad_top and pad_left must be >= 0, got " +
                                                                   std::to_string(image.pad_top) + ", " +
                                                                   std::to_string(image.pad_left));
  TORCH_CHECK_VALUE(image.resized_height <= shape.out_height - image.pad_top &&
                        image.resized_width <= shape.out_width - image.pad_left,
                    where + "the resized image (" + std::to_string(image.resized_height) + "x" +
                        std::to_string(image.resized_width) + " at top " + std::to_string(image.pad_top) + ", left " +
                        std::to_string(image.pad_left) + ") does not fit the canvas of out (" +
                        std::to_string(shape.out_height) + "x" + std::to_string(shape.out_width) + ")");
}

}  // namespace

LetterboxShape check_letterbox_args(const at::Tensor& images, const at::Tensor& image_params,
                                    const at::Tensor& value_table, const at::Tensor& out) {
  TORCH_CHECK_VALUE(images.dim() == 1, "letterbox: images must be 1-D (the images packed back to back), got shape " +
                                           shape_string(images));
  TORCH_CHECK_TYPE(images.scalar_type() == at::kByte, "letterbox: images must be uint8, got " + dtype_name(images));
  TORCH_CHECK_VALUE(image_params.dim() == 2 && image_params.size(1) == kParamCount,
                    "letterbox: image_params must be (B, " + std::to_string(kParamCount) + "), got shape " +
                        shape_string(image_params));
  TORCH_CHECK_TYPE(image_params.scalar_type() == at::kLong,
                   "letterbox: image_params must be int64, got " + dtype_name(image_params));
  TORCH_CHECK(image_params.is_cpu(),
              "letterbox: image_params must be a CPU tensor (it is checked on the host), got one on " +
                  image_params.device().str());
  TORCH_CHECK_VALUE(
      value_table.dim() == 1 && value_table.size(0) == 256,
      "letterbox: value_table must hold 256 values (one per byte), got shape " + shape_string(value_table));
  const at::ScalarType dtype = value_table.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
                   "letterbox: value_table must be float32, float16 or bfloat16, got " + dtype_name(value_table));
  TORCH_CHECK_VALUE(out.dim() == 4 && out.size(0) == image_params.size(0) && out.size(1) == kChannels,
                    "letterbox: out must be (B, 3, height, width) with B = " + std::to_string(image_params.size(0)) +
                        " (the rows of image_params), got shape " + shape_string(out));
  TORCH_CHECK_TYPE(out.scalar_type() == dtype, "letterbox: out must have value_table's dtype " +
                                                   dtype_name(value_table) + ", got " + dtype_name(out));
  TORCH_CHECK_VALUE(out.is_contiguous(), "letterbox: out must be contiguous");
  TORCH_CHECK(value_table.device() == images.device() && out.device() == images.device(),
              "letterbox: images, value_table and out must be on one device, got " + images.device().str() + ", " +
                  value_table.device().str() + " and " + out.device().str());
  at::assert_no_overlap(out, images);

  LetterboxShape shape;
  shape.batch = out.size(0);
  shape.out_height = out.size(2);
  shape.out_width = out.size(3);
  const at::Tensor params = image_params.contiguous();
  const int64_t* table = params.const_data_ptr<int64_t>();
  for (int64_t index = 0; index < shape.batch; ++index)
    check_image(image_params_at(table, index), index, images.numel(), shape);
  return shape;
}

namespace {

// The column and row taps of one image, computed once per call.
struct ImageTaps {
  std::vector<Tap> columns, rows;
};

// One task per output row of one image: the three planes of that row, padding included.
template <typename scalar_t>
void letterbox_cpu_kernel(const uint8_t* images, const int64_t* image_params, const scalar_t* value_table,
                          scalar_t* out, const LetterboxShape& shape) {
  std::vector<ImageTaps> taps(shape.batch);
  at::parallel_for(0, shape.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const ImageParams image = image_params_at(image_params, index);
      const double scale_x = resize_scale(image.in_width, image.resized_width);
      const double scale_y = resize_scale(image.in_height, image.resized_height);
      taps[index].columns.resize(image.resized_width);
      taps[index].rows.resize(image.resized_height);
      for (int64_t x = 0; x < image.resized_width; ++x)
        taps[index].columns[x] = resize_tap(x, image.in_width, scale_x, /*clamp_weights=*/true);
      for (int64_t y = 0; y < image.resized_height; ++y)
        taps[index].rows[y] = resize_tap(y, image.in_height, scale_y, /*clamp_weights=*/false);
    }
  });

  const int64_t plane_size = shape.out_height * shape.out_width;
  const scalar_t padding = value_table[kPaddingValue];
  at::parallel_for(0, shape.batch * shape.out_height, 16, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t batch = task / shape.out_height, out_y = task % shape.out_height;
      const ImageParams image = image_params_at(image_params, batch);
      scalar_t* planes[kChannels];  // R, G, B rows of this output row
      for (int channel = 0; channel < kChannels; ++channel)
        planes[channel] = out + (batch * kChannels + channel) * plane_size + out_y * shape.out_width;
      const int64_t y = out_y - image.pad_top;
      if (y < 0 || y >= image.resized_height) {
        for (int channel = 0; channel < kChannels; ++channel)
          std::fill(planes[channel], planes[channel] + shape.out_width, padding);
        continue;
      }
      const int64_t right = image.pad_left + image.resized_width;
      for (int channel = 0; channel < kChannels; ++channel) {
        std::fill(planes[channel], planes[channel] + image.pad_left, padding);
        std::fill(planes[channel] + right, planes[channel] + shape.out_width, padding);
      }
      const int64_t row_stride = image.in_width * kChannels;
      const Tap& row_tap = taps[batch].rows[y];
      const std::vector<Tap>& column_taps = taps[batch].columns;
      for (int64_t x = 0; x < image.resized_width; ++x) {
        uint8_t bgr[kChannels];
        resized_pixel(images + image.offset, row_stride, row_tap, column_taps[x], bgr);
        for (int channel = 0; channel < kChannels; ++channel)
          planes[channel][image.pad_left + x] = value_table[bgr[kChannels - 1 - channel]];
      }
    }
  });
}

void letterbox_cpu(const at::Tensor& images, const at::Tensor& image_params, const at::Tensor& value_table,
                   const at::Tensor& out) {
  const LetterboxShape shape = check_letterbox_args(images, image_params, value_table, out);
  if (out.numel() == 0) return;
  const at::Tensor images_dense = images.contiguous(), params_dense = image_params.contiguous(),
                   table_dense = value_table.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, value_table.scalar_type(), "letterbox_cpu", [&] {
    letterbox_cpu_kernel<scalar_t>(images_dense.const_data_ptr<uint8_t>(), params_dense.const_data_ptr<int64_t>(),
                                   table_dense.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), shape);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU, m) { m.impl("letterbox", &letterbox_cpu); }

}  // namespace letterbox
}  // namespace yolo_fastdetect
