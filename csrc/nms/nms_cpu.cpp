// Batched NMS on the CPU (one image per task), and the argument checks shared with the CUDA launcher.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <functional>
#include <tuple>
#include <vector>

#include "nms.h"

namespace yolo_fastdetect {

void check_nms_args(const at::Tensor& prediction, int64_t num_classes, double conf_thres, double iou_thres,
                    at::OptionalIntArrayRef classes, bool agnostic, bool multi_label, int64_t max_det, int64_t max_nms,
                    double max_wh, NmsParams& params) {
  TORCH_CHECK_VALUE(prediction.dim() == 3, "batched_nms: prediction must be (B, 4 + nc + nm, A), got ",
                    text(prediction.sizes()));
  TORCH_CHECK_TYPE(prediction.scalar_type() == at::kFloat || prediction.scalar_type() == at::kHalf ||
                       prediction.scalar_type() == at::kBFloat16,
                   "batched_nms: prediction must be float32, float16 or bfloat16, got ", prediction.scalar_type());
  TORCH_CHECK_VALUE(num_classes >= 1 && 4 + num_classes <= prediction.size(1),
                    "batched_nms: num_classes must be in [1, ", text(prediction.size(1) - 4), "] for prediction with ",
                    text(prediction.size(1)), " channels, got ", text(num_classes));
  // Written as negations so that NaN fails too.
  TORCH_CHECK_VALUE(conf_thres >= 0 && conf_thres <= 1, "batched_nms: conf_thres must be in [0, 1], got ",
                    text(conf_thres));
  TORCH_CHECK_VALUE(iou_thres >= 0 && iou_thres <= 1, "batched_nms: iou_thres must be in [0, 1], got ",
                    text(iou_thres));
  TORCH_CHECK_VALUE(max_det >= 1, "batched_nms: max_det must be at least 1, got ", text(max_det));
  TORCH_CHECK_VALUE(max_nms >= 1, "batched_nms: max_nms must be at least 1, got ", text(max_nms));
  TORCH_CHECK_VALUE(std::isfinite(max_wh), "batched_nms: max_wh must be finite, got ", text(max_wh));

  params.batch = prediction.size(0);
  params.num_anchors = prediction.size(2);
  params.num_classes = num_classes;
  params.num_extra = prediction.size(1) - 4 - num_classes;
  for (int dim = 0; dim < 3; ++dim) params.strides[dim] = prediction.stride(dim);
  params.multi_label = multi_label && num_classes > 1;
  params.class_offset = agnostic ? 0.f : static_cast<float>(max_wh);
  params.max_det = max_det;

  const int64_t candidates_per_image = params.num_anchors * (params.multi_label ? num_classes : 1);
  params.max_candidates = std::max<int64_t>(1, std::min(max_nms, candidates_per_image));
  // Candidate indices (anchor * nc + class) and per-bin counts are 32-bit.
  TORCH_CHECK_VALUE(params.num_anchors * num_classes < (int64_t{1} << 31), "batched_nms: ", text(params.num_anchors),
                    " anchors x ", text(num_classes), " classes are too many candidates per image");
  const uint64_t last_index = static_cast<uint64_t>(std::max<int64_t>(params.num_anchors * num_classes, 2) - 1);
  params.key_bits = 0;
  while ((last_index >> params.key_bits) != 0) ++params.key_bits;

  params.class_filter_size = -1;
  if (classes.has_value()) {
    TORCH_CHECK_VALUE(classes->size() <= static_cast<size_t>(kMaxClassFilter), "batched_nms: classes may list at most ",
                      text(kMaxClassFilter), " classes, got ", text(classes->size()));
    params.class_filter_size = static_cast<int>(classes->size());
    std::copy(classes->begin(), classes->end(), params.class_filter);
  }
}

float conf_thres_in_dtype(double conf_thres, at::ScalarType dtype) {
  float rounded = 0.f;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "conf_thres_in_dtype", [&] {
    rounded = static_cast<float>(static_cast<scalar_t>(static_cast<float>(conf_thres)));
  });
  return rounded;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_nms_outputs(const NmsParams& params,
                                                                 const at::TensorOptions& options) {
  return {at::empty({params.batch, params.max_det, 6 + params.num_extra}, options.dtype(at::kFloat)),
          at::empty({params.batch}, options.dtype(at::kLong)),
          at::empty({params.batch, params.max_det}, options.dtype(at::kLong))};
}

namespace {

// Anchors scanned together, class by class: a class's scores of consecutive anchors are adjacent in memory, so the
// running maxima vectorise, where an anchor-by-anchor scan (for_each_candidate) reads one score per cache line.
constexpr int64_t kScanAnchors = 256;

// The running first maximum of `count` anchors' scores, one class's row at a time; then visit(anchor, class, score)
// for each candidate of those anchors.
template <int64_t kAnchorStride, typename scalar_t, typename Visit>
void scan_anchors(const scalar_t* image_scores, int64_t first_anchor, int64_t count, const NmsParams& params,
                  Visit& visit) {
  const int64_t anchor_stride = kAnchorStride > 0 ? kAnchorStride : params.strides[2];
  float best_score[kScanAnchors];
  int32_t best_class[kScanAnchors];
  int32_t has_nan[kScanAnchors];  // as wide as a float, so that the loop vectorises
  std::fill_n(best_score, count, -INFINITY);
  std::fill_n(best_class, count, 0);
  std::fill_n(has_nan, count, 0);
  for (int64_t cls = 0; cls < params.num_classes; ++cls) {
    const scalar_t* row = image_scores + cls * params.strides[1] + first_anchor * anchor_stride;
    for (int64_t a = 0; a < count; ++a) {
      const float score = static_cast<float>(row[a * anchor_stride]);
      has_nan[a] |= score != score;
      const bool better = score > best_score[a];  // strict: the first maximum wins, as torch.max
      best_score[a] = better ? score : best_score[a];
      best_class[a] = better ? static_cast<int32_t>(cls) : best_class[a];
    }
  }
  for (int64_t a = 0; a < count; ++a) {
    const int64_t anchor = first_anchor + a;
    visit_scanned_anchor(image_scores + anchor * anchor_stride, params.strides[1], best_class[a], best_score[a],
                         has_nan[a] != 0, params, [&](int64_t cls, float score) { visit(anchor, cls, score); });
  }
}

// Calls visit(anchor, class, score) for every candidate of one image, in blocks of kScanAnchors anchors.
template <typename scalar_t, typename Visit>
void for_each_image_candidate(const scalar_t* image_scores, const NmsParams& params, Visit&& visit) {
  for (int64_t first = 0; first < params.num_anchors; first += kScanAnchors) {
    const int64_t count = std::min(kScanAnchors, params.num_anchors - first);
    if (params.strides[2] == 1)  // the Detect head's layout: a compile-time stride lets the scan vectorise
      scan_anchors<1>(image_scores, first, count, params, visit);
    else scan_anchors<0>(image_scores, first, count, params, visit);
  }
}

template <typename scalar_t>
void nms_cpu_kernel(const scalar_t* prediction, const NmsParams& params, double iou_thres, float* detections,
                    int64_t* counts, int64_t* anchor_indices) {
  const int64_t row_size = 6 + params.num_extra;
  at::parallel_for(0, params.batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> keys;
    std::vector<Candidate> kept;
    for (int64_t image = begin; image < end; ++image) {
      const scalar_t* image_prediction = prediction + image * params.strides[0];
      const scalar_t* image_scores = image_prediction + 4 * params.strides[1];
      keys.clear();
      for_each_image_candidate(image_scores, params, [&](int64_t anchor, int64_t cls, float score) {
        keys.push_back(sort_key(score, anchor * params.num_classes + cls, params));
      });
      const auto descending = std::greater<uint64_t>();
      if (static_cast<int64_t>(keys.size()) > params.max_candidates) {
        std::nth_element(keys.begin(), keys.begin() + (params.max_candidates - 1), keys.end(), descending);
        keys.resize(params.max_candidates);
      }
      std::sort(keys.begin(), keys.end(), descending);

      // Greedy suppression, stopping once max_det boxes are kept: later boxes cannot change the first max_det.
      kept.clear();
      float* image_detections = detections + image * params.max_det * row_size;
      int64_t* image_indices = anchor_indices + image * params.max_det;
      for (const uint64_t key : keys) {
        const Candidate candidate = decode_candidate(image_prediction, key, params);
        const bool suppressed = std::any_of(kept.begin(), kept.end(), [&](const Candidate& earlier) {
          return iou_above(earlier.offset_box, candidate.offset_box, iou_thres);
        });
        if (suppressed) continue;
        const int64_t slot = static_cast<int64_t>(kept.size());
        write_detection(image_prediction, candidate, params, image_detections + slot * row_size);
        image_indices[slot] = candidate.anchor;
        kept.push_back(candidate);
        if (slot + 1 == params.max_det) break;
      }
      const int64_t num_kept = static_cast<int64_t>(kept.size());
      counts[image] = num_kept;
      std::fill(image_detections + num_kept * row_size, image_detections + params.max_det * row_size, 0.f);
      std::fill(image_indices + num_kept, image_indices + params.max_det, int64_t{-1});
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batched_nms_cpu(const at::Tensor& prediction, int64_t num_classes,
                                                               double conf_thres, double iou_thres,
                                                               at::OptionalIntArrayRef classes, bool agnostic,
                                                               bool multi_label, int64_t max_det, int64_t max_nms,
                                                               double max_wh) {
  NmsParams params;
  check_nms_args(prediction, num_classes, conf_thres, iou_thres, classes, agnostic, multi_label, max_det, max_nms,
                 max_wh, params);
  params.conf_thres = conf_thres_in_dtype(conf_thres, prediction.scalar_type());
  const auto [detections, counts, anchor_indices] = empty_nms_outputs(params, prediction.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, prediction.scalar_type(), "batched_nms_cpu", [&] {
    nms_cpu_kernel<scalar_t>(prediction.const_data_ptr<scalar_t>(), params, iou_thres,
                             detections.mutable_data_ptr<float>(), counts.mutable_data_ptr<int64_t>(),
                             anchor_indices.mutable_data_ptr<int64_t>());
  });
  return {detections, counts, anchor_indices};
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CPU, m) { m.impl("batched_nms", &batched_nms_cpu); }

}  // namespace yolo_fastdetect
