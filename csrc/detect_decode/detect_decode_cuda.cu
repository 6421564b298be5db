// Detect-head decode on the GPU: one launch for all levels, boxes and scores.
//
// The grid has two parts. Blocks [0, box_blocks) give one thread per (batch, anchor): it reads the anchor's
// 4 * reg_max box logits (coalesced across the warp, anchors being the fastest dimension) and writes its box.
// The remaining blocks apply the sigmoid to the class rows, each block one chunk of one (batch, class) row,
// each thread kScoresPerThread elements spaced a block apart so every load of the warp is coalesced.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "detect_decode.h"

namespace yolo_fastdetect {
namespace {

constexpr int kThreads = 256;
constexpr int kScoresPerThread = 4;
constexpr int64_t kScoreChunk = kThreads * kScoresPerThread;

template <typename scalar_t, int RegMax>
__global__ void __launch_bounds__(kThreads)
    detect_decode_kernel(const scalar_t* __restrict__ boxes, const scalar_t* __restrict__ scores,
                         scalar_t* __restrict__ out, const DecodeShape shape, const LevelTable levels, const bool xywh,
                         const int64_t box_blocks, const int64_t chunks_per_row) {
  const int64_t num_anchors = shape.num_anchors;
  const int64_t out_channels = 4 + shape.num_classes;
  const int64_t block = blockIdx.x;
  if (block < box_blocks) {
    const int64_t index = block * kThreads + threadIdx.x;
    if (index >= shape.batch * num_anchors) return;
    const int64_t batch = index / num_anchors, anchor = index - batch * num_anchors;
    float box[4];
    decode_anchor_box<RegMax>(boxes + batch * shape.box_strides[0] + anchor * shape.box_strides[2],
                              shape.box_strides[1], levels, anchor, xywh, box);
    scalar_t* out_anchor = out + batch * out_channels * num_anchors + anchor;
#pragma unroll
    for (int side = 0; side < 4; ++side) out_anchor[side * num_anchors] = static_cast<scalar_t>(box[side]);
    return;
  }
  const int64_t score_block = block - box_blocks;
  const int64_t row = score_block / chunks_per_row;  // batch * num_classes + class
  const int64_t chunk_start = (score_block - row * chunks_per_row) * kScoreChunk;
  const int64_t batch = row / shape.num_classes, cls = row - batch * shape.num_classes;
  const scalar_t* logits = scores + batch * shape.score_strides[0] + cls * shape.score_strides[1];
  scalar_t* probabilities = out + (batch * out_channels + 4 + cls) * num_anchors;
  float values[kScoresPerThread];
#pragma unroll
  for (int k = 0; k < kScoresPerThread; ++k) {
    const int64_t anchor = chunk_start + k * kThreads + threadIdx.x;
    values[k] = anchor < num_anchors ? static_cast<float>(logits[anchor * shape.score_strides[2]]) : 0.f;
  }
#pragma unroll
  for (int k = 0; k < kScoresPerThread; ++k) {
    const int64_t anchor = chunk_start + k * kThreads + threadIdx.x;
    if (anchor < num_anchors) probabilities[anchor] = static_cast<scalar_t>(sigmoid<scalar_t>(values[k]));
  }
}

at::Tensor detect_decode_cuda(const at::Tensor& boxes, const at::Tensor& scores, at::IntArrayRef level_shapes,
                              at::ArrayRef<double> level_strides, int64_t reg_max, bool xywh) {
  LevelTable levels;
  DecodeShape shape;
  check_detect_decode_args(boxes, scores, level_shapes, level_strides, reg_max, levels, shape);
  TORCH_CHECK(boxes.is_cuda(), "detect_decode: boxes must be a CUDA tensor");
  const c10::cuda::CUDAGuard device_guard(boxes.device());
  at::Tensor out = at::empty({shape.batch, 4 + shape.num_classes, shape.num_anchors}, boxes.options());
  if (out.numel() == 0) return out;

  const int64_t box_blocks = (shape.batch * shape.num_anchors + kThreads - 1) / kThreads;
  const int64_t chunks_per_row = (shape.num_anchors + kScoreChunk - 1) / kScoreChunk;
  const int64_t total_blocks = box_blocks + shape.batch * shape.num_classes * chunks_per_row;
  TORCH_CHECK(total_blocks < (int64_t{1} << 31), "detect_decode: input too large for one launch");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "detect_decode_cuda", [&] {
    const auto* box_ptr = boxes.const_data_ptr<scalar_t>();
    const auto* score_ptr = scores.const_data_ptr<scalar_t>();
    auto* out_ptr = out.mutable_data_ptr<scalar_t>();
    if (reg_max == 16)
      detect_decode_kernel<scalar_t, 16><<<total_blocks, kThreads, 0, stream>>>(
          box_ptr, score_ptr, out_ptr, shape, levels, xywh, box_blocks, chunks_per_row);
    else
      detect_decode_kernel<scalar_t, 1><<<total_blocks, kThreads, 0, stream>>>(
          box_ptr, score_ptr, out_ptr, shape, levels, xywh, box_blocks, chunks_per_row);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CUDA, m) { m.impl("detect_decode", &detect_decode_cuda); }

}  // namespace yolo_fastdetect
