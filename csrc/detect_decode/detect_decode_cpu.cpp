// Detect-head decode on the CPU, and the argument checks shared with the CUDA launcher.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>

#include "detect_decode.h"

namespace yolo_fastdetect {

void check_detect_decode_args(const at::Tensor& boxes, const at::Tensor& scores, at::IntArrayRef level_shapes,
                              at::ArrayRef<double> level_strides, int64_t reg_max, LevelTable& levels,
                              DecodeShape& shape) {
  TORCH_CHECK_VALUE(reg_max == 1 || reg_max == 16, "detect_decode: reg_max must be 1 or 16, got ", text(reg_max));
  TORCH_CHECK_VALUE(boxes.dim() == 3, "detect_decode: boxes must be (B, 4*reg_max, A), got ", text(boxes.sizes()));
  TORCH_CHECK_VALUE(scores.dim() == 3, "detect_decode: scores must be (B, nc, A), got ", text(scores.sizes()));
  TORCH_CHECK_VALUE(boxes.size(1) == 4 * reg_max, "detect_decode: boxes must have 4*reg_max = ", text(4 * reg_max),
                    " channels, got ", text(boxes.size(1)));
  TORCH_CHECK_VALUE(scores.size(0) == boxes.size(0), "detect_decode: scores batch ", text(scores.size(0)),
                    " != boxes batch ", text(boxes.size(0)));
  TORCH_CHECK_VALUE(scores.size(2) == boxes.size(2), "detect_decode: scores has ", text(scores.size(2)),
                    " anchors but boxes has ", text(boxes.size(2)));
  TORCH_CHECK_TYPE(
      boxes.scalar_type() == at::kFloat || boxes.scalar_type() == at::kHalf || boxes.scalar_type() == at::kBFloat16,
      "detect_decode: boxes must be float32, float16 or bfloat16, got ", boxes.scalar_type());
  TORCH_CHECK_TYPE(scores.scalar_type() == boxes.scalar_type(), "detect_decode: scores dtype ", scores.scalar_type(),
                   " != boxes dtype ", boxes.scalar_type());
  TORCH_CHECK(scores.device() == boxes.device(), "detect_decode: scores is on ", scores.device(), " but boxes is on ",
              boxes.device());

  const int64_t num_levels = static_cast<int64_t>(level_strides.size());
  TORCH_CHECK_VALUE(num_levels >= 1 && num_levels <= kMaxLevels, "detect_decode: level_strides must hold 1 to ",
                    text(kMaxLevels), " levels, got ", text(num_levels));
  TORCH_CHECK_VALUE(static_cast<int64_t>(level_shapes.size()) == 2 * num_levels,
                    "detect_decode: level_shapes must hold (h, w) for each of the ", text(num_levels), " levels, got ",
                    text(level_shapes.size()), " values");
  levels.num_levels = static_cast<int>(num_levels);
  int64_t num_anchors = 0;
  for (int64_t level = 0; level < num_levels; ++level) {
    const int64_t height = level_shapes[2 * level], width = level_shapes[2 * level + 1];
    TORCH_CHECK_VALUE(height > 0 && width > 0, "detect_decode: level_shapes level ", text(level), " is ", text(height),
                      "x", text(width), "; sizes must be positive");
    const double stride = level_strides[level];
    TORCH_CHECK_VALUE(std::isfinite(stride) && stride > 0, "detect_decode: level_strides[", text(level),
                      "] must be positive, got ", text(stride));
    num_anchors += height * width;
    levels.level_end[level] = num_anchors;
    levels.width[level] = width;
    levels.stride[level] = static_cast<float>(stride);
  }
  TORCH_CHECK_VALUE(num_anchors == boxes.size(2), "detect_decode: level_shapes give ", text(num_anchors),
                    " anchors but boxes has ", text(boxes.size(2)));

  shape.batch = boxes.size(0);
  shape.num_classes = scores.size(1);
  shape.num_anchors = num_anchors;
  for (int dim = 0; dim < 3; ++dim) {
    shape.box_strides[dim] = boxes.stride(dim);
    shape.score_strides[dim] = scores.stride(dim);
  }
}

namespace {

// Anchors decoded together: the DFL and sigmoid loops run across a tile's anchors (contiguous in memory), which
// the compiler vectorises; 4 * reg_max rows of a tile stay in the L1 cache between the softmax passes.
constexpr int kTile = 64;
constexpr int64_t kTilesPerTask = 4;
constexpr int64_t kScoresPerTask = 16384;

template <typename scalar_t, int RegMax>
void decode_box_tile(const scalar_t* boxes_batch, int64_t num_anchors, int64_t first, const LevelTable& levels,
                     bool xywh, scalar_t* out_batch) {
  float distance[4][kTile];
  for (int side = 0; side < 4; ++side) {
    const scalar_t* side_logits = boxes_batch + side * RegMax * num_anchors + first;
    dfl_expectation<RegMax, kTile, scalar_t>(
        [&](int bin, int lane) { return static_cast<float>(side_logits[bin * num_anchors + lane]); }, distance[side]);
  }
  for (int lane = 0; lane < kTile; ++lane) {
    float centre_x, centre_y, stride, box[4];
    anchor_centre<scalar_t>(levels, first + lane, centre_x, centre_y, stride);
    const float anchor_distance[4] = {distance[0][lane], distance[1][lane], distance[2][lane], distance[3][lane]};
    distances_to_box<scalar_t>(centre_x, centre_y, anchor_distance, stride, xywh, box);
    for (int side = 0; side < 4; ++side)
      out_batch[side * num_anchors + first + lane] = static_cast<scalar_t>(box[side]);
  }
}

// Inputs are contiguous (B, C, A). Boxes: each task takes kTilesPerTask tiles of one batch image; the last,
// partial tile of an image is decoded anchor by anchor.
template <typename scalar_t, int RegMax>
void decode_cpu_kernel(const scalar_t* boxes, const scalar_t* scores, scalar_t* out, const DecodeShape& shape,
                       const LevelTable& levels, bool xywh) {
  const int64_t num_anchors = shape.num_anchors, num_classes = shape.num_classes;
  const int64_t tiles_per_image = (num_anchors + kTile - 1) / kTile;
  at::parallel_for(0, shape.batch * tiles_per_image, kTilesPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t batch = task / tiles_per_image;
      const int64_t first = (task % tiles_per_image) * kTile;
      const int64_t count = std::min<int64_t>(kTile, num_anchors - first);
      const scalar_t* boxes_batch = boxes + batch * 4 * RegMax * num_anchors;
      scalar_t* out_batch = out + batch * (4 + num_classes) * num_anchors;
      if (count == kTile) {
        decode_box_tile<scalar_t, RegMax>(boxes_batch, num_anchors, first, levels, xywh, out_batch);
      } else {
        for (int64_t anchor = first; anchor < first + count; ++anchor) {
          float box[4];
          decode_anchor_box<RegMax>(boxes_batch + anchor, num_anchors, levels, anchor, xywh, box);
          for (int side = 0; side < 4; ++side)
            out_batch[side * num_anchors + anchor] = static_cast<scalar_t>(box[side]);
        }
      }
    }
  });
  // Class scores: per image, the (nc, A) logits and the output's class rows are each one contiguous block, so the
  // sigmoid runs as one flat, vectorised loop over it.
  const int64_t scores_per_image = num_classes * num_anchors;
  at::parallel_for(0, shape.batch * scores_per_image, kScoresPerTask, [&](int64_t begin, int64_t end) {
    while (begin < end) {
      const int64_t batch = begin / scores_per_image, offset = begin % scores_per_image;
      const int64_t count = std::min(end - begin, scores_per_image - offset);
      const scalar_t* logits = scores + batch * scores_per_image + offset;
      scalar_t* probabilities = out + (batch * (4 + num_classes) + 4) * num_anchors + offset;
      for (int64_t index = 0; index < count; ++index)
        probabilities[index] = static_cast<scalar_t>(sigmoid<scalar_t>(static_cast<float>(logits[index])));
      begin += count;
    }
  });
}

at::Tensor detect_decode_cpu(const at::Tensor& boxes, const at::Tensor& scores, at::IntArrayRef level_shapes,
                             at::ArrayRef<double> level_strides, int64_t reg_max, bool xywh) {
  LevelTable levels;
  DecodeShape shape;
  check_detect_decode_args(boxes, scores, level_shapes, level_strides, reg_max, levels, shape);
  at::Tensor out = at::empty({shape.batch, 4 + shape.num_classes, shape.num_anchors}, boxes.options());
  if (out.numel() == 0) return out;
  const at::Tensor boxes_dense = boxes.contiguous(), scores_dense = scores.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "detect_decode_cpu", [&] {
    const auto* box_ptr = boxes_dense.const_data_ptr<scalar_t>();
    const auto* score_ptr = scores_dense.const_data_ptr<scalar_t>();
    auto* out_ptr = out.mutable_data_ptr<scalar_t>();
    if (reg_max == 16) decode_cpu_kernel<scalar_t, 16>(box_ptr, score_ptr, out_ptr, shape, levels, xywh);
    else decode_cpu_kernel<scalar_t, 1>(box_ptr, score_ptr, out_ptr, shape, levels, xywh);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU, m) { m.impl("detect_decode", &detect_decode_cpu); }

}  // namespace yolo_fastdetect
