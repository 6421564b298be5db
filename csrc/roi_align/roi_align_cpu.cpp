// RoIAlign on the CPU: forward and backward, one or several levels.
//
// The forward pass runs RoIs in parallel; for each bin it computes the sample taps once and reuses them for
// every channel. The backward pass runs channels in parallel, so each task owns its slice of the gradient and
// needs no atomics (and sums in a fixed order: the result is deterministic).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "roi_align.h"

namespace yolo_fastdetect {
namespace roi_align {
namespace {

// The rois as the kernels read them: contiguous, in the accumulation type (float64 rois come only with float64
// features).
at::Tensor rois_for_kernel(const at::Tensor& rois) {
  return rois.to(accumulation_dtype(rois.scalar_type())).contiguous();
}

// Taps of every sample of bin (ph, pw), in the order iy * grid_w + ix that the argmax refers to.
template <typename acc_t>
void bin_taps(const RoiBins<acc_t>& bins, int64_t ph, int64_t pw, int64_t height, int64_t width, int64_t stride_h,
              int64_t stride_w, std::vector<PointTaps<acc_t>>& taps) {
  taps.clear();
  for (int iy = 0; iy < bins.grid_h; ++iy) {
    const AxisTaps<acc_t> y =
        axis_taps(sample_coordinate(bins.start_y, bins.bin_height, ph, iy, bins.grid_h), height, stride_h);
    for (int ix = 0; ix < bins.grid_w; ++ix) {
      const AxisTaps<acc_t> x =
          axis_taps(sample_coordinate(bins.start_x, bins.bin_width, pw, ix, bins.grid_w), width, stride_w);
      taps.push_back(point_taps(y, x));
    }
  }
}

template <typename scalar_t, typename acc_t>
void forward_kernel(const LevelTable<const scalar_t>& levels, const acc_t* rois, const int64_t* roi_levels,
                    int64_t num_rois, const PoolParams& params, scalar_t* out, int32_t* argmax) {
  const int64_t channels = levels.channels, num_bins = params.pooled_height * params.pooled_width;
  at::parallel_for(0, num_rois, 1, [&](int64_t begin, int64_t end) {
    std::vector<PointTaps<acc_t>> taps;
    for (int64_t k = begin; k < end; ++k) {
      scalar_t* out_roi = out + k * channels * num_bins;
      int32_t* argmax_roi = argmax == nullptr ? nullptr : argmax + k * channels * num_bins;
      const acc_t* roi = rois + 5 * k;
      int level;
      int64_t batch_index;
      if (!roi_source(roi, roi_levels, k, levels, level, batch_index)) {
        std::fill(out_roi, out_roi + channels * num_bins, scalar_t(0));
        if (argmax_roi != nullptr) std::fill(argmax_roi, argmax_roi + channels * num_bins, -1);
        continue;
      }
      const RoiBins<acc_t> bins = roi_bins(roi, static_cast<acc_t>(levels.spatial_scale[level]), params);
      const acc_t count = static_cast<acc_t>(std::max(bins.grid_h * bins.grid_w, 1));
      const scalar_t* image = levels.data[level] + batch_index * levels.stride_n[level];
      for (int64_t bin = 0; bin < num_bins; ++bin) {
        bin_taps(bins, bin / params.pooled_width, bin % params.pooled_width, levels.height[level], levels.width[level],
                 levels.stride_h[level], levels.stride_w[level], taps);
        for (int64_t c = 0; c < channels; ++c) {
          const scalar_t* plane = image + c * levels.stride_c[level];
          acc_t pooled = 0;
          if (params.max_mode) {
            int32_t best_sample = -1;
            acc_t best = -std::numeric_limits<acc_t>::infinity();
            for (size_t sample = 0; sample < taps.size(); ++sample) {
              const acc_t value = interpolate(plane, taps[sample]);
              if (value > best) best = value, best_sample = static_cast<int32_t>(sample);
            }
            pooled = best_sample >= 0 ? best : acc_t(0);
            argmax_roi[c * num_bins + bin] = best_sample;
          } else {
            for (const auto& sample : taps) pooled += interpolate(plane, sample);
            pooled /= count;
          }
          out_roi[c * num_bins + bin] = static_cast<scalar_t>(pooled);
        }
      }
    }
  });
}

// grads: one (N, C, H, W) buffer per level in the accumulation dtype; grad_output contiguous (K, C, PH, PW).
template <typename scalar_t, typename acc_t>
void backward_kernel(const LevelTable<acc_t>& grads, const acc_t* rois, const int64_t* roi_levels, int64_t num_rois,
                     const PoolParams& params, const scalar_t* grad_output, const int32_t* argmax) {
  const int64_t channels = grads.channels, num_bins = params.pooled_height * params.pooled_width;
  at::parallel_for(0, channels, 1, [&](int64_t channel_begin, int64_t channel_end) {
    std::vector<PointTaps<acc_t>> taps;
    for (int64_t k = 0; k < num_rois; ++k) {
      const acc_t* roi = rois + 5 * k;
      int level;
      int64_t batch_index;
      if (!roi_source(roi, roi_levels, k, grads, level, batch_index)) continue;
      const RoiBins<acc_t> bins = roi_bins(roi, static_cast<acc_t>(grads.spatial_scale[level]), params);
      const acc_t count = static_cast<acc_t>(std::max(bins.grid_h * bins.grid_w, 1));
      acc_t* image = grads.data[level] + batch_index * grads.stride_n[level];
      for (int64_t bin = 0; bin < num_bins; ++bin) {
        bin_taps(bins, bin / params.pooled_width, bin % params.pooled_width, grads.height[level], grads.width[level],
                 grads.stride_h[level], grads.stride_w[level], taps);
        for (int64_t c = channel_begin; c < channel_end; ++c) {
          const int64_t out_index = (k * channels + c) * num_bins + bin;
          const acc_t gradient = static_cast<acc_t>(grad_output[out_index]);
          acc_t* plane = image + c * grads.stride_c[level];
          auto scatter = [&](const PointTaps<acc_t>& sample, acc_t scale) {
            if (!sample.valid) return;
            for (int tap = 0; tap < 4; ++tap) plane[sample.offset[tap]] += sample.weight[tap] * scale;
          };
          if (params.max_mode) {
            const int32_t best_sample = argmax[out_index];
            if (best_sample >= 0 && best_sample < static_cast<int64_t>(taps.size()))
              scatter(taps[best_sample], gradient);
          } else {
            for (const auto& sample : taps) scatter(sample, gradient / count);
          }
        }
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> multiscale_forward_cpu(at::TensorList features, const at::Tensor& rois,
                                                          const at::Tensor& roi_levels, int64_t pooled_height,
                                                          int64_t pooled_width, at::ArrayRef<double> spatial_scales,
                                                          int64_t sampling_ratio, bool aligned, bool max_mode) {
  const CheckedArgs args = check_forward_args("roi_align", features, rois, roi_levels, pooled_height, pooled_width,
                                              spatial_scales, sampling_ratio, aligned, max_mode, true);
  const at::Tensor& first = features[0];
  const int64_t num_rois = rois.size(0), channels = first.size(1);
  at::Tensor out = at::empty({num_rois, channels, pooled_height, pooled_width}, first.options());
  at::Tensor argmax = at::empty(max_mode ? out.sizes() : at::IntArrayRef{0}, first.options().dtype(at::kInt));
  if (out.numel() == 0) return {out, argmax};
  const at::Tensor kernel_rois = rois_for_kernel(rois);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, first.scalar_type(), "roi_align_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    forward_kernel<scalar_t, acc_t>(
        level_table<const scalar_t>(features, spatial_scales), kernel_rois.const_data_ptr<acc_t>(),
        args.roi_levels.defined() ? args.roi_levels.const_data_ptr<int64_t>() : nullptr, num_rois, args.params,
        out.mutable_data_ptr<scalar_t>(), max_mode ? argmax.mutable_data_ptr<int32_t>() : nullptr);
  });
  return {out, argmax};
}

std::vector<at::Tensor> multiscale_backward_cpu(const at::Tensor& grad_output, const at::Tensor& rois,
                                                const at::Tensor& roi_levels, const at::Tensor& argmax,
                                                at::IntArrayRef feature_shapes, at::ArrayRef<double> spatial_scales,
                                                int64_t sampling_ratio, bool aligned, bool max_mode) {
  const CheckedArgs args = check_backward_args("roi_align_backward", grad_output, rois, roi_levels, argmax,
                                               feature_shapes, spatial_scales, sampling_ratio, aligned, max_mode);
  const at::ScalarType dtype = grad_output.scalar_type();
  std::vector<at::Tensor> grads;
  for (size_t level = 0; level < feature_shapes.size() / 4; ++level)
    grads.push_back(
        at::zeros(feature_shapes.slice(4 * level, 4), grad_output.options().dtype(accumulation_dtype(dtype))));
  if (grad_output.numel() > 0) {
    const at::Tensor grad_contiguous = grad_output.contiguous();
    const at::Tensor argmax_contiguous = max_mode ? argmax.contiguous() : argmax;
    const at::Tensor kernel_rois = rois_for_kernel(rois);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "roi_align_backward_cpu", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      backward_kernel<scalar_t, acc_t>(level_table<acc_t>(grads, spatial_scales), kernel_rois.const_data_ptr<acc_t>(),
                                       args.roi_levels.defined() ? args.roi_levels.const_data_ptr<int64_t>() : nullptr,
                                       rois.size(0), args.params, grad_contiguous.const_data_ptr<scalar_t>(),
                                       max_mode ? argmax_contiguous.const_data_ptr<int32_t>() : nullptr);
    });
  }
  for (auto& grad : grads) grad = grad.to(dtype);
  return grads;
}

std::tuple<at::Tensor, at::Tensor> roi_align_cpu(const at::Tensor& input, const at::Tensor& rois, int64_t pooled_height,
                                                 int64_t pooled_width, double spatial_scale, int64_t sampling_ratio,
                                                 bool aligned, bool max_mode) {
  return multiscale_forward_cpu({input}, rois, at::Tensor(), pooled_height, pooled_width, {spatial_scale},
                                sampling_ratio, aligned, max_mode);
}

at::Tensor roi_align_backward_cpu(const at::Tensor& grad_output, const at::Tensor& rois, const at::Tensor& argmax,
                                  at::IntArrayRef input_shape, double spatial_scale, int64_t sampling_ratio,
                                  bool aligned, bool max_mode) {
  return multiscale_backward_cpu(grad_output, rois, at::Tensor(), argmax, input_shape, {spatial_scale}, sampling_ratio,
                                 aligned, max_mode)[0];
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU, m) {
  m.impl("roi_align", &roi_align_cpu);
  m.impl("roi_align_backward", &roi_align_backward_cpu);
  m.impl("multiscale_roi_align", &multiscale_forward_cpu);
  m.impl("multiscale_roi_align_backward", &multiscale_backward_cpu);
}

}  // namespace roi_align
}  // namespace yolo_fastdetect
