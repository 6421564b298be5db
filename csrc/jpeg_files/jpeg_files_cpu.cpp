// decode_jpeg_files: read and decode a batch of JPEG files on threads of this library (see jpeg_files.h).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "jpeg_files.h"

namespace yolo_fastdetect {
namespace jpeg_files {
namespace {

constexpr int64_t kReadModeRgb = 3;  // torchvision.io.ImageReadMode.RGB

using DecodeJpeg = at::Tensor(const at::Tensor&, int64_t, bool);

// The file's bytes, or an undefined tensor where it cannot be read (or is empty).
at::Tensor read_file(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file || std::fseek(file.get(), 0, SEEK_END) != 0) return {};
  const long size = std::ftell(file.get());
  if (size <= 0 || std::fseek(file.get(), 0, SEEK_SET) != 0) return {};
  at::Tensor data = at::empty({size}, at::kByte);
  if (std::fread(data.data_ptr<uint8_t>(), 1, size_t(size), file.get()) != size_t(size)) return {};
  return data;
}

// torchvision's (3, H, W) RGB result as (H, W, 3) BGR. Its decoder writes interleaved RGB rows and returns them
// permuted to CHW, so the permutation back is the decoder's own buffer, where red and blue swap in place.
at::Tensor bgr_rows(const at::Tensor& rgb) {
  at::Tensor rows = rgb.permute({1, 2, 0});
  if (!rows.is_contiguous()) rows = rows.contiguous();
  uint8_t* pixel = rows.data_ptr<uint8_t>();
  for (uint8_t* const end = pixel + rows.numel(); pixel < end; pixel += 3) std::swap(pixel[0], pixel[2]);
  return rows;
}

// One file's BGR image, or an empty tensor where it is declined or anything fails (the caller uses imread).
at::Tensor decode_file(const std::string& path, bool apply_exif_orientation,
                       const c10::TypedOperatorHandle<DecodeJpeg>& decode_jpeg) {
  try {
    const at::Tensor data = read_file(path);
    if (!data.defined() || !decodable(data.data_ptr<uint8_t>(), size_t(data.numel()))) return at::empty({0}, at::kByte);
    const at::Tensor rgb = decode_jpeg.call(data, kReadModeRgb, apply_exif_orientation);
    if (rgb.dim() != 3 || rgb.size(0) != 3 || rgb.scalar_type() != at::kByte) return at::empty({0}, at::kByte);
    return bgr_rows(rgb);
  } catch (const std::exception&) {
    return at::empty({0}, at::kByte);
  }
}

std::vector<at::Tensor> decode_jpeg_files(const std::vector<std::string>& paths, bool apply_exif_orientation,
                                          int64_t threads) {
  TORCH_CHECK_VALUE(threads >= 1, "decode_jpeg_files: threads must be at least 1");
  const auto handle = c10::Dispatcher::singleton().findSchema({"image::decode_jpeg", ""});
  TORCH_CHECK(handle.has_value(), "decode_jpeg_files: torchvision's image operators are not loaded");
  const auto decode_jpeg = handle->typed<DecodeJpeg>();
  std::vector<at::Tensor> images(paths.size());
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t index; (index = next++) < paths.size();)
      images[index] = decode_file(paths[index], apply_exif_orientation, decode_jpeg);
  };
  std::vector<std::thread> helpers;
  const size_t helper_count = std::min<size_t>(size_t(threads), paths.size()) - (paths.empty() ? 0 : 1);
  for (size_t helper = 0; helper < helper_count; ++helper) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {  // no thread to be had: the ones running (and this one) do every file
      break;
    }
  }
  work();
  for (std::thread& helper : helpers) helper.join();
  return images;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CompositeExplicitAutograd, m) { m.impl("decode_jpeg_files", &decode_jpeg_files); }

}  // namespace jpeg_files
}  // namespace yolo_fastdetect
