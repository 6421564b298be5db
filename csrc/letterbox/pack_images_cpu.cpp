// Host staging of the letterbox's images: contiguous uint8 images copied into one flat buffer (pinned memory, on
// the way to the GPU) at their byte offsets, over at most a few of ATen's intra-op threads. The letterbox uses it for a
// batch that fits one staging piece, typically batch 1 (yolo_fastdetect/ops/letterbox.py).
//
// Why a few: four threads take most of what copying over every core gains against one. The every-core copy gave the
// slowest batch-1 preprocess stage measured, in a busy run, though a later run found no tail to blame on it; four
// leave the other cores to the process's other threads (the decoders of yolo_fastdetect.sources) at a few hundredths
// of a millisecond more a call (see benchmarks/RESULTS.md, Letterbox preprocessing).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace yolo_fastdetect {
namespace letterbox {
namespace {

constexpr int64_t kMaxThreads = 4;
constexpr int64_t kMinBytesPerThread = 512 << 10;  // below this a thread's start-up costs more than it copies

void pack_images_cpu(const at::Tensor& packed, at::TensorList images, at::IntArrayRef offsets) {
  TORCH_CHECK_VALUE(packed.device().is_cpu() && packed.scalar_type() == at::kByte && packed.is_contiguous(),
                    "pack_images: packed must be a contiguous uint8 CPU tensor");
  TORCH_CHECK_VALUE(images.size() == offsets.size(), "pack_images: images and offsets must have one length, got " +
                                                         std::to_string(images.size()) + " and " +
                                                         std::to_string(offsets.size()));
  const auto count = static_cast<int64_t>(images.size());
  std::vector<const uint8_t*> sources(count);
  std::vector<int64_t> starts(count + 1, 0);  // each image's first byte in the images' concatenation
  for (int64_t i = 0; i < count; ++i) {
    const at::Tensor& image = images[i];
    TORCH_CHECK_VALUE(image.device().is_cpu() && image.scalar_type() == at::kByte && image.is_contiguous(),
                      "pack_images: images[" + std::to_string(i) + "] must be a contiguous uint8 CPU tensor");
    const int64_t size = image.numel();
    TORCH_CHECK_VALUE(offsets[i] >= 0 && offsets[i] <= packed.numel() && size <= packed.numel() - offsets[i],
                      "pack_images: images[" + std::to_string(i) + "] (" + std::to_string(size) + " bytes) at offset " +
                          std::to_string(offsets[i]) + " does not fit in packed (" + std::to_string(packed.numel()) +
                          " bytes)");
    sources[i] = image.data_ptr<uint8_t>();
    starts[i + 1] = starts[i] + size;
  }
  uint8_t* destination = packed.data_ptr<uint8_t>();
  const int64_t total = starts[count];
  const int64_t grain = std::max(kMinBytesPerThread, (total + kMaxThreads - 1) / kMaxThreads);
  // at::parallel_for runs min(intra-op threads, total / grain) threads, each on one range of the concatenation.
  at::parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    auto image = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
    for (; image < count && starts[image] < end; ++image) {
      const int64_t from = std::max(begin, starts[image]) - starts[image];
      const int64_t to = std::min(end, starts[image + 1]) - starts[image];
      if (to > from) std::memcpy(destination + offsets[image] + from, sources[image] + from, to - from);
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU, m) { m.impl("pack_images", &pack_images_cpu); }

}  // namespace letterbox
}  // namespace yolo_fastdetect
