// Batched NMS on the GPU: the whole batch in three steps, no host synchronisation, fixed-size buffers (so a
// CUDA graph can capture it).
//
// 1. select_candidates_kernel, one block per image: writes the image's candidates' sort keys to its segment of a
//    (B * max_candidates) buffer; when there are more than max_candidates (max_nms), finds the max_candidates-th
//    largest key by a radix select (8 bits a round, from the top; keys are unique, so exactly max_candidates keys
//    are >= it) and writes those keys instead.
// 2. cub's segmented radix sort orders every image's segment by key, descending: score descending, then
//    candidate index ascending, the order in which the stock function visits boxes.
// 3. suppress_kernel, one block per image: greedy suppression over tiles of 64 sorted candidates. A candidate
//    is dropped when a box kept in an earlier tile overlaps it (all pairs tested in parallel) or when an earlier
//    kept box of its own tile does (a 64-bit mask per tile row, resolved in order by one thread). Kept boxes
//    are written straight to the output; the loop ends once max_det boxes are kept.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cub/device/device_segmented_radix_sort.cuh>

#include <climits>
#include <tuple>

#include "nms.h"

namespace yolo_fastdetect {
namespace {

constexpr int kSelectThreads = 1024;
constexpr int kRadixBits = 8;
constexpr int kRadixBins = 1 << kRadixBits;
constexpr int kTile = 64;  // candidates per suppression step: one bit each in a 64-bit mask
constexpr int kWarp = 32;
constexpr int kSuppressThreads = 512;
// Kept boxes live in shared memory up to this many (max_det 300 needs 4.8 KB), in a global scratch otherwise.
constexpr int64_t kMaxSharedKept = 2048;

// Calls visit(key) for every candidate of one image, the block's threads striding over its anchors.
template <typename scalar_t, typename Visit>
__device__ void for_each_image_candidate(const scalar_t* image_prediction, const NmsParams& params, Visit&& visit) {
  const scalar_t* scores = image_prediction + 4 * params.strides[1];
  for (int64_t anchor = threadIdx.x; anchor < params.num_anchors; anchor += blockDim.x)
    for_each_candidate(scores + anchor * params.strides[2], params.strides[1], params, [&](int64_t cls, float score) {
      visit(sort_key(score, anchor * params.num_classes + cls, params));
    });
}

template <typename scalar_t>
__global__ void __launch_bounds__(kSelectThreads)
    select_candidates_kernel(const scalar_t* __restrict__ prediction, const NmsParams params,
                             uint64_t* __restrict__ selected, int* __restrict__ segment_begin,
                             int* __restrict__ segment_end) {
  __shared__ unsigned int histogram[kRadixBins];
  __shared__ uint64_t threshold_prefix;  // leading bits of the max_candidates-th largest key found so far
  __shared__ uint64_t prefix_mask;       // which bits of threshold_prefix are known
  __shared__ unsigned long long rank;    // rank (1-based, descending) of that key among keys with the prefix
  __shared__ unsigned int num_selected;  // candidates seen by the first pass (all of them)
  __shared__ unsigned int retaken;       // keys taken again after a selection

  const int64_t image = blockIdx.x;
  const int64_t capacity = params.max_candidates;
  const scalar_t* image_prediction = prediction + image * params.strides[0];
  if (threadIdx.x == 0) {
    threshold_prefix = 0;
    prefix_mask = 0;
    rank = static_cast<unsigned long long>(capacity);
    num_selected = 0;
    retaken = 0;
  }
  __syncthreads();

  // One pass takes every candidate while they fit (the usual case: a trained model leaves a few hundred); the
  // count it ends with says whether a selection must follow. A counting pass before the taking one made the kernel
  // about twice as slow (see benchmarks/RESULTS.md, End to end).
  uint64_t* image_selected = selected + image * capacity;
  for_each_image_candidate(image_prediction, params, [&](uint64_t key) {
    const unsigned int slot = atomicAdd(&num_selected, 1u);
    if (slot < capacity) image_selected[slot] = key;
  });
  __syncthreads();
  const unsigned long long num_candidates = num_selected;
  const bool over_capacity = num_candidates > static_cast<unsigned long long>(capacity);
  if (over_capacity) {
    for (int shift = (sort_key_bits(params) - 1) / kRadixBits * kRadixBits; shift >= 0; shift -= kRadixBits) {
      for (int bin = threadIdx.x; bin < kRadixBins; bin += blockDim.x) histogram[bin] = 0;
      __syncthreads();
      const uint64_t prefix = threshold_prefix, mask = prefix_mask;
      for_each_image_candidate(image_prediction, params, [&](uint64_t key) {
        if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & (kRadixBins - 1)], 1u);
      });
      __syncthreads();
      if (threadIdx.x == 0) {
        unsigned long long above = 0;  // keys with the prefix in higher bins
        for (int bin = kRadixBins - 1; bin >= 0; --bin) {
          if (above + histogram[bin] >= rank) {
            rank -= above;
            threshold_prefix |= static_cast<uint64_t>(bin) << shift;
            break;
          }
          above += histogram[bin];
        }
        prefix_mask |= static_cast<uint64_t>(kRadixBins - 1) << shift;
      }
      __syncthreads();
    }
    // Exactly `capacity` keys are >= the threshold (keys are unique): taken again, over what the first pass wrote.
    const uint64_t threshold = threshold_prefix;
    for_each_image_candidate(image_prediction, params, [&](uint64_t key) {
      if (key >= threshold) image_selected[atomicAdd(&retaken, 1u)] = key;
    });
  }
  if (threadIdx.x == 0) {
    segment_begin[image] = static_cast<int>(image * capacity);
    segment_end[image] = static_cast<int>(image * capacity + (over_capacity ? capacity : num_candidates));
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kSuppressThreads)
    suppress_kernel(const scalar_t* __restrict__ prediction, const NmsParams params, const float iou_thres,
                    const uint64_t* __restrict__ sorted_keys, const int* __restrict__ segment_end,
                    float* __restrict__ kept_boxes_scratch, float* __restrict__ detections,
                    int64_t* __restrict__ counts, int64_t* __restrict__ anchor_indices) {
  extern __shared__ float shared_kept_boxes[];
  __shared__ Candidate tile[kTile];
  __shared__ uint64_t overlaps_later[kTile];  // row i: bit j set when tile box j (j > i) overlaps tile box i
  __shared__ unsigned long long suppressed_by_kept;
  __shared__ uint64_t kept_in_tile;
  __shared__ int64_t num_kept;

  const int64_t image = blockIdx.x;
  const int64_t row_size = 6 + params.num_extra;
  const int64_t first_key = image * params.max_candidates;
  const int64_t num_candidates = segment_end[image] - first_key;
  const scalar_t* image_prediction = prediction + image * params.strides[0];
  float* image_detections = detections + image * params.max_det * row_size;
  int64_t* image_indices = anchor_indices + image * params.max_det;
  // Class-offset boxes kept so far, 4 floats each, in kept order.
  float* kept_boxes =
      kept_boxes_scratch == nullptr ? shared_kept_boxes : kept_boxes_scratch + image * params.max_det * 4;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  constexpr int kWarps = kSuppressThreads / kWarp;
  if (threadIdx.x == 0) num_kept = 0;
  // The first tile's key, then each next tile's, loaded a tile ahead so that its latency overlaps a tile's work.
  uint64_t next_key =
      threadIdx.x < min(static_cast<int64_t>(kTile), num_candidates) ? sorted_keys[first_key + threadIdx.x] : 0;
  __syncthreads();

  for (int64_t tile_start = 0; tile_start < num_candidates && num_kept < params.max_det; tile_start += kTile) {
    const int tile_size = static_cast<int>(min(static_cast<int64_t>(kTile), num_candidates - tile_start));
    if (threadIdx.x < tile_size) {
      tile[threadIdx.x] = decode_candidate(image_prediction, next_key, params);
      const int64_t ahead = tile_start + kTile + threadIdx.x;
      if (ahead < num_candidates) next_key = sorted_keys[first_key + ahead];
    }
    if (threadIdx.x == 0) suppressed_by_kept = 0;
    __syncthreads();

    // Each warp tests one kept box against half a tile at a time (lane j: candidate half * 32 + j) and ORs the
    // warp's ballot into the tile's mask: one shared atomic per 32 pairs, where a pair-per-thread loop made one per
    // overlapping pair on the same word. Every lane of a warp runs the same iterations, as the ballot needs.
    const int64_t kept_before = num_kept;
    for (int64_t unit = warp; unit < kept_before * 2; unit += kWarps) {
      const int64_t kept = unit / 2;
      const int half = static_cast<int>(unit % 2), candidate = half * kWarp + lane;
      const float earlier[4] = {kept_boxes[4 * kept], kept_boxes[4 * kept + 1], kept_boxes[4 * kept + 2],
                                kept_boxes[4 * kept + 3]};
      const bool overlaps = candidate < tile_size && iou_above(earlier, tile[candidate].offset_box, iou_thres);
      const unsigned bits = __ballot_sync(0xffffffffu, overlaps);
      if (lane == 0 && bits) atomicOr(&suppressed_by_kept, static_cast<unsigned long long>(bits) << (half * kWarp));
    }
    // The tile's own overlaps: a warp per row, each lane testing a later box of each half (j > i).
    for (int row = warp; row < tile_size; row += kWarps) {
      uint64_t overlaps = 0;
      for (int half = 0; half < 2; ++half) {
        const int later = half * kWarp + lane;
        const bool hit =
            later > row && later < tile_size && iou_above(tile[row].offset_box, tile[later].offset_box, iou_thres);
        overlaps |= static_cast<uint64_t>(__ballot_sync(0xffffffffu, hit)) << (half * kWarp);
      }
      if (lane == 0) overlaps_later[row] = overlaps;
    }
    __syncthreads();

    // Greedy resolution in tile order, visiting only the boxes still alive: the lowest alive box is kept and
    // drops the later boxes it overlaps (a kept box's row holds later boxes only).
    if (threadIdx.x == 0) {
      uint64_t alive = (tile_size == kTile ? ~uint64_t{0} : (uint64_t{1} << tile_size) - 1) & ~suppressed_by_kept;
      uint64_t kept = 0;
      for (int64_t room = params.max_det - kept_before; alive && room > 0; --room) {
        const int i = __ffsll(static_cast<long long>(alive)) - 1;
        kept |= uint64_t{1} << i;
        alive &= ~overlaps_later[i] & ~(uint64_t{1} << i);
      }
      kept_in_tile = kept;
      num_kept = kept_before + __popcll(kept);
    }
    __syncthreads();

    // Kept boxes are written by the thread that decoded them (it alone touches tile[threadIdx.x] until the next
    // tile's decode); the next tile reads kept_boxes only after that decode's barrier.
    if (threadIdx.x < tile_size && ((kept_in_tile >> threadIdx.x) & 1)) {
      const int64_t slot = kept_before + __popcll(kept_in_tile & ((uint64_t{1} << threadIdx.x) - 1));
      const Candidate& candidate = tile[threadIdx.x];
      write_detection(image_prediction, candidate, params, image_detections + slot * row_size);
      image_indices[slot] = candidate.anchor;
      for (int k = 0; k < 4; ++k) kept_boxes[4 * slot + k] = candidate.offset_box[k];
    }
  }
  __syncthreads();

  // Padding: zero rows and index -1 after the kept ones.
  for (int64_t element = num_kept * row_size + threadIdx.x; element < params.max_det * row_size; element += blockDim.x)
    image_detections[element] = 0.f;
  for (int64_t slot = num_kept + threadIdx.x; slot < params.max_det; slot += blockDim.x) image_indices[slot] = -1;
  if (threadIdx.x == 0) counts[image] = num_kept;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batched_nms_cuda(const at::Tensor& prediction, int64_t num_classes,
                                                                double conf_thres, double iou_thres,
                                                                at::OptionalIntArrayRef classes, bool agnostic,
                                                                bool multi_label, int64_t max_det, int64_t max_nms,
                                                                double max_wh) {
  NmsParams params;
  check_nms_args(prediction, num_classes, conf_thres, iou_thres, classes, agnostic, multi_label, max_det, max_nms,
                 max_wh, params);
  TORCH_CHECK(prediction.is_cuda(), "batched_nms: prediction must be a CUDA tensor");
  const c10::cuda::CUDAGuard device_guard(prediction.device());
  params.conf_thres = conf_thres_in_dtype(conf_thres, prediction.scalar_type());
  const auto options = prediction.options();
  const auto [detections, counts, anchor_indices] = empty_nms_outputs(params, options);
  if (params.batch == 0) return {detections, counts, anchor_indices};

  const int64_t capacity = params.max_candidates;
  TORCH_CHECK_VALUE(params.batch * capacity < INT_MAX, "batched_nms: batch ", text(params.batch), " x max_nms ",
                    text(capacity), " exceeds the sort's 32-bit item count");
  at::Tensor keys = at::empty({2, params.batch * capacity}, options.dtype(at::kLong));  // selected, then sorted
  at::Tensor segments = at::empty({2, params.batch}, options.dtype(at::kInt));          // begin, end offsets
  auto* selected_keys = reinterpret_cast<uint64_t*>(keys[0].mutable_data_ptr<int64_t>());
  auto* sorted_keys = reinterpret_cast<uint64_t*>(keys[1].mutable_data_ptr<int64_t>());
  int* segment_begin = segments[0].mutable_data_ptr<int>();
  int* segment_end = segments[1].mutable_data_ptr<int>();
  const bool kept_in_shared = max_det <= kMaxSharedKept;
  at::Tensor kept_boxes_scratch;
  if (!kept_in_shared) kept_boxes_scratch = at::empty({params.batch, max_det, 4}, options.dtype(at::kFloat));
  const size_t kept_shared_bytes = kept_in_shared ? static_cast<size_t>(max_det) * 4 * sizeof(float) : 0;

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, prediction.scalar_type(), "batched_nms_cuda", [&] {
    const auto* prediction_ptr = prediction.const_data_ptr<scalar_t>();
    select_candidates_kernel<scalar_t><<<params.batch, kSelectThreads, 0, stream>>>(
        prediction_ptr, params, selected_keys, segment_begin, segment_end);
    C10_CUDA_KERNEL_LAUNCH_CHECK();

    const int num_items = static_cast<int>(params.batch * capacity);
    const int num_segments = static_cast<int>(params.batch);
    size_t sort_bytes = 0;
    C10_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(nullptr, sort_bytes, selected_keys, sorted_keys,
                                                                     num_items, num_segments, segment_begin,
                                                                     segment_end, 0, sort_key_bits(params), stream));
    at::Tensor sort_storage = at::empty({static_cast<int64_t>(sort_bytes)}, options.dtype(at::kByte));
    C10_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(
        sort_storage.mutable_data_ptr(), sort_bytes, selected_keys, sorted_keys, num_items, num_segments, segment_begin,
        segment_end, 0, sort_key_bits(params), stream));

    suppress_kernel<scalar_t><<<params.batch, kSuppressThreads, kept_shared_bytes, stream>>>(
        prediction_ptr, params, static_cast<float>(iou_thres), sorted_keys, segment_end,
        kept_in_shared ? nullptr : kept_boxes_scratch.mutable_data_ptr<float>(), detections.mutable_data_ptr<float>(),
        counts.mutable_data_ptr<int64_t>(), anchor_indices.mutable_data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {detections, counts, anchor_indices};
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CUDA, m) { m.impl("batched_nms", &batched_nms_cuda); }

}  // namespace yolo_fastdetect
