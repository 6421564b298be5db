// Detect-head decode: per-anchor math shared by the CPU and CUDA kernels.
//
// Layout (Ultralytics 8.4 Detect.forward_head): boxes (B, 4 * reg_max, A) with channel = side * reg_max + bin,
// sides ordered left, top, right, bottom; scores (B, nc, A); anchors concatenated over levels (P3, P4, P5, ...),
// row-major (y, then x) inside a level. Output (B, 4 + nc, A): cx, cy, w, h (or x1, y1, x2, y2) in input pixels,
// then sigmoid class scores.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <ATen/core/Tensor.h>

#include "../common.h"

namespace yolo_fastdetect {

// Kernel parameters are passed by value, so the level table has a fixed capacity.
constexpr int kMaxLevels = 32;

struct LevelTable {
  int num_levels;
  int64_t level_end[kMaxLevels];  // one past the last anchor index of each level
  int64_t width[kMaxLevels];      // grid width of each level (anchors per row)
  float stride[kMaxLevels];       // input pixels per grid cell
};

struct DecodeShape {
  int64_t batch;
  int64_t num_classes;
  int64_t num_anchors;
  int64_t box_strides[3];    // element strides of boxes along (B, C, A)
  int64_t score_strides[3];  // element strides of scores along (B, C, A)
};

// Stock's half decode (float16, bfloat16) materialises every step in the features' dtype: each PyTorch op computes
// in float and rounds its output to the dtype (round to nearest even: c10::Half, __float2half_rn on CUDA). The
// kernels round at the same points, so that their boxes and scores equal stock's bit for bit, but where a float sum
// added in another order (or, on the CPU, another exp) lands on a rounding boundary: about 1e-5 of the boxes. For
// float32 rounding is the identity and the math is the plain float decode.
template <typename scalar_t>
YFD_HOST_DEVICE float round_to(float x) {
  return static_cast<float>(static_cast<scalar_t>(x));
}

// exp(x) in float as stock's half ops take it: the CUDA math library's expf on the GPU, libm's on the CPU (the CPU
// sigmoid, over every float16 and bfloat16 value, gives ATen's results bit for bit). float32 keeps fast_expf.
template <typename scalar_t>
YFD_HOST_DEVICE float exp_as_stock(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  if constexpr (std::is_same_v<scalar_t, float>) return fast_expf(x);
  else return std::exp(x);
#endif
}

// Anchor centre of anchor `a` in grid units (x + 0.5, y + 0.5, as make_anchors: the cell index and the centre each
// in the dtype) and its level's stride (in the dtype, as make_anchors' stride tensor).
template <typename scalar_t>
YFD_HOST_DEVICE void anchor_centre(const LevelTable& levels, int64_t a, float& centre_x, float& centre_y,
                                   float& stride) {
  int level = 0;
  int64_t level_start = 0;
  while (level + 1 < levels.num_levels && a >= levels.level_end[level]) {
    level_start = levels.level_end[level];
    ++level;
  }
  const int64_t local = a - level_start;
  const int64_t width = levels.width[level];
  centre_x = round_to<scalar_t>(round_to<scalar_t>(static_cast<float>(local % width)) + 0.5f);
  centre_y = round_to<scalar_t>(round_to<scalar_t>(static_cast<float>(local / width)) + 0.5f);
  stride = round_to<scalar_t>(levels.stride[level]);
}

// Expected distance of one box side for `Lanes` anchors at once: softmax over reg_max bins, then
// sum_k k * p_k (DFL). `logit(bin, lane)` returns the logit as float. The CUDA kernel calls it with one lane
// on logits held in registers; the CPU kernel with a tile of anchors, so that its loops vectorise.
// reg_max == 1 (YOLO26) has no distribution: the logit is the distance.
// float32 divides once, by the sum of the weights. Half follows stock: the softmax (max subtracted, exp and sum in
// float, exp / sum rounded to the dtype), then the conv's sum of k * p_k (each product exact in float) rounded
// once; stock's conv adds in an order of its own, which float hides but for the rare sum on a rounding boundary.
template <int RegMax, int Lanes, typename scalar_t, typename LogitFn>
YFD_HOST_DEVICE void dfl_expectation(const LogitFn& logit, float (&distance)[Lanes]) {
  if (RegMax == 1) {
    for (int lane = 0; lane < Lanes; ++lane) distance[lane] = logit(0, lane);
    return;
  }
  constexpr bool kRounds = !std::is_same_v<scalar_t, float>;
  float max_logit[Lanes], weight_sum[Lanes], weighted_bins[Lanes];
  [[maybe_unused]] float weights[kRounds ? RegMax : 1][Lanes];  // half: exp(logit - max), divided once summed
  for (int lane = 0; lane < Lanes; ++lane) {
    max_logit[lane] = logit(0, lane);
    weight_sum[lane] = 0.f;
    weighted_bins[lane] = 0.f;
  }
#pragma unroll
  for (int bin = 1; bin < RegMax; ++bin)
    for (int lane = 0; lane < Lanes; ++lane) {
      const float value = logit(bin, lane);
      max_logit[lane] = value > max_logit[lane] ? value : max_logit[lane];
    }
#pragma unroll
  for (int bin = 0; bin < RegMax; ++bin)
    for (int lane = 0; lane < Lanes; ++lane) {
      const float weight = exp_as_stock<scalar_t>(logit(bin, lane) - max_logit[lane]);
      weight_sum[lane] += weight;
      if constexpr (kRounds) weights[bin][lane] = weight;
      else weighted_bins[lane] += static_cast<float>(bin) * weight;
    }
  if constexpr (kRounds) {
#pragma unroll
    for (int bin = 0; bin < RegMax; ++bin)
      for (int lane = 0; lane < Lanes; ++lane)
        weighted_bins[lane] += static_cast<float>(bin) * round_to<scalar_t>(weights[bin][lane] / weight_sum[lane]);
    for (int lane = 0; lane < Lanes; ++lane) distance[lane] = round_to<scalar_t>(weighted_bins[lane]);
  } else {
    for (int lane = 0; lane < Lanes; ++lane) distance[lane] = weighted_bins[lane] / weight_sum[lane];
  }
}

// dist2bbox: left/top/right/bottom distances around the anchor centre -> box, scaled to input pixels; each step
// rounded to the dtype as stock's ops round it.
template <typename scalar_t>
YFD_HOST_DEVICE void distances_to_box(float centre_x, float centre_y, const float (&distance)[4], float stride,
                                      bool xywh, float (&box)[4]) {
  const auto r = [](float value) { return round_to<scalar_t>(value); };
  const float x1 = r(centre_x - distance[0]), y1 = r(centre_y - distance[1]);
  const float x2 = r(centre_x + distance[2]), y2 = r(centre_y + distance[3]);
  if (xywh) {
    box[0] = r(r(r(x1 + x2) / 2.f) * stride);
    box[1] = r(r(r(y1 + y2) / 2.f) * stride);
    box[2] = r(r(x2 - x1) * stride);
    box[3] = r(r(y2 - y1) * stride);
  } else {
    box[0] = r(x1 * stride);
    box[1] = r(y1 * stride);
    box[2] = r(x2 * stride);
    box[3] = r(y2 * stride);
  }
}

template <typename scalar_t>
YFD_HOST_DEVICE float sigmoid(float x) {
  return 1.f / (1.f + exp_as_stock<scalar_t>(-x));
}

// Decode one anchor's box: reads its 4 * RegMax logits through `box_logits` (pointer at channel 0 of this
// batch and anchor, channel stride `channel_stride`) and returns the box in `box`.
template <int RegMax, typename scalar_t>
YFD_HOST_DEVICE void decode_anchor_box(const scalar_t* box_logits, int64_t channel_stride, const LevelTable& levels,
                                       int64_t anchor, bool xywh, float (&box)[4]) {
  float distance[4];
#pragma unroll
  for (int side = 0; side < 4; ++side) {
    float logits[RegMax];
#pragma unroll
    for (int bin = 0; bin < RegMax; ++bin)
      logits[bin] = static_cast<float>(box_logits[(side * RegMax + bin) * channel_stride]);
    float side_distance[1];
    dfl_expectation<RegMax, 1, scalar_t>([&](int bin, int) { return logits[bin]; }, side_distance);
    distance[side] = side_distance[0];
  }
  float centre_x, centre_y, stride;
  anchor_centre<scalar_t>(levels, anchor, centre_x, centre_y, stride);
  distances_to_box<scalar_t>(centre_x, centre_y, distance, stride, xywh, box);
}

// Validates the operator's arguments (raising errors that name the argument) and builds the level table and
// shape description. Defined in detect_decode_cpu.cpp, used by both launchers.
void check_detect_decode_args(const at::Tensor& boxes, const at::Tensor& scores, at::IntArrayRef level_shapes,
                              at::ArrayRef<double> level_strides, int64_t reg_max, LevelTable& levels,
                              DecodeShape& shape);

}  // namespace yolo_fastdetect
