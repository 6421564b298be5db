// Detect-head decode on the GPU: one launch for all levels, boxes and scores.
//
// The op is memory-bound (it reads 64 + nc values and writes 4 + nc per anchor), so the kernel is organised
// around wide, coalesced loads. Anchors are the fastest dimension; each thread handles `Vec` consecutive
// anchors (Vec = 4 when the tensors are aligned for it, else 1) so that a 16-bit warp load moves 256 bytes.
// The grid has two parts. Blocks [0, box_blocks) decode boxes: per thread, Vec anchors' 4 * reg_max logits.
// The remaining blocks apply the sigmoid to the class rows, each block one chunk of one (batch, class) row.
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
constexpr int kVectorsPerThread = 4;  // score vectors in flight per thread

// Vec elements loaded or stored as one aligned access.
template <typename scalar_t, int Vec>
struct alignas(sizeof(scalar_t) * Vec) Packed {
  scalar_t value[Vec];
};

template <typename scalar_t, int Vec>
__device__ __forceinline__ Packed<scalar_t, Vec> load_packed(const scalar_t* address) {
  return *reinterpret_cast<const Packed<scalar_t, Vec>*>(address);
}

template <typename scalar_t, int Vec>
__device__ __forceinline__ void store_packed(scalar_t* address, const float (&values)[Vec]) {
  Packed<scalar_t, Vec> packed;
#pragma unroll
  for (int lane = 0; lane < Vec; ++lane) packed.value[lane] = static_cast<scalar_t>(values[lane]);
  *reinterpret_cast<Packed<scalar_t, Vec>*>(address) = packed;
}

template <typename scalar_t, int RegMax, int Vec>
__device__ __forceinline__ void decode_boxes(const scalar_t* __restrict__ boxes, scalar_t* __restrict__ out,
                                             const DecodeShape& shape, const LevelTable& levels, bool xywh,
                                             int64_t first_index) {
  const int64_t num_anchors = shape.num_anchors;
  const int64_t batch = first_index / num_anchors, first = first_index - batch * num_anchors;
  const scalar_t* anchor_logits = boxes + batch * shape.box_strides[0] + first * shape.box_strides[2];
  float box[4][Vec];
#pragma unroll
  for (int side = 0; side < 4; ++side) {
    Packed<scalar_t, Vec> logits[RegMax];
#pragma unroll
    for (int bin = 0; bin < RegMax; ++bin)
      logits[bin] = load_packed<scalar_t, Vec>(anchor_logits + (side * RegMax + bin) * shape.box_strides[1]);
    dfl_expectation<RegMax, Vec>([&](int bin, int lane) { return static_cast<float>(logits[bin].value[lane]); },
                                 box[side]);
  }
#pragma unroll
  for (int lane = 0; lane < Vec; ++lane) {
    float centre_x, centre_y, stride, decoded[4];
    anchor_centre(levels, first + lane, centre_x, centre_y, stride);
    const float distance[4] = {box[0][lane], box[1][lane], box[2][lane], box[3][lane]};
    distances_to_box(centre_x, centre_y, distance, stride, xywh, decoded);
#pragma unroll
    for (int side = 0; side < 4; ++side) box[side][lane] = decoded[side];
  }
  scalar_t* out_anchor = out + batch * (4 + shape.num_classes) * num_anchors + first;
#pragma unroll
  for (int side = 0; side < 4; ++side) store_packed<scalar_t, Vec>(out_anchor + side * num_anchors, box[side]);
}

template <typename scalar_t, int RegMax, int Vec>
__global__ void __launch_bounds__(kThreads) detect_decode_kernel(const scalar_t* __restrict__ boxes,
                                                                 const scalar_t* __restrict__ scores,
                                                                 scalar_t* __restrict__ out, const DecodeShape shape,
                                                                 const LevelTable levels, const bool xywh,
                                                                 const int64_t box_blocks,
                                                                 const int64_t chunks_per_row) {
  const int64_t num_anchors = shape.num_anchors;
  const int64_t block = blockIdx.x;
  if (block < box_blocks) {
    const int64_t first_index = (block * kThreads + threadIdx.x) * Vec;  // Vec divides num_anchors
    if (first_index < shape.batch * num_anchors)
      decode_boxes<scalar_t, RegMax, Vec>(boxes, out, shape, levels, xywh, first_index);
    return;
  }
  constexpr int64_t chunk = int64_t{kThreads} * kVectorsPerThread * Vec;
  const int64_t score_block = block - box_blocks;
  const int64_t row = score_block / chunks_per_row;  // batch * num_classes + class
  const int64_t chunk_start = (score_block - row * chunks_per_row) * chunk;
  const int64_t batch = row / shape.num_classes, cls = row - batch * shape.num_classes;
  const scalar_t* logits = scores + batch * shape.score_strides[0] + cls * shape.score_strides[1];
  scalar_t* probabilities = out + (batch * (4 + shape.num_classes) + 4 + cls) * num_anchors;
  Packed<scalar_t, Vec> loaded[kVectorsPerThread];
#pragma unroll
  for (int k = 0; k < kVectorsPerThread; ++k) {  // all loads first: kVectorsPerThread in flight per thread
    const int64_t anchor = chunk_start + (k * kThreads + threadIdx.x) * Vec;
    if (anchor < num_anchors) {
      if (Vec > 1) {
        loaded[k] = load_packed<scalar_t, Vec>(logits + anchor);
      } else {
        loaded[k].value[0] = logits[anchor * shape.score_strides[2]];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kVectorsPerThread; ++k) {
    const int64_t anchor = chunk_start + (k * kThreads + threadIdx.x) * Vec;
    if (anchor < num_anchors) {
      float values[Vec];
#pragma unroll
      for (int lane = 0; lane < Vec; ++lane) values[lane] = sigmoid(static_cast<float>(loaded[k].value[lane]));
      store_packed<scalar_t, Vec>(probabilities + anchor, values);
    }
  }
}

// Vec = 4 needs every row start and the anchor count to be multiples of 4 elements and unit anchor strides.
bool can_vectorize(const at::Tensor& tensor, int64_t width) {
  const auto element_bytes = static_cast<int64_t>(tensor.element_size());
  return tensor.stride(2) == 1 && tensor.stride(1) % width == 0 && tensor.stride(0) % width == 0 &&
         tensor.size(2) % width == 0 &&
         reinterpret_cast<uintptr_t>(tensor.const_data_ptr()) % (width * element_bytes) == 0;
}

template <typename scalar_t, int RegMax, int Vec>
void launch(const at::Tensor& boxes, const at::Tensor& scores, at::Tensor& out, const DecodeShape& shape,
            const LevelTable& levels, bool xywh) {
  const int64_t box_threads = shape.batch * shape.num_anchors / Vec;
  const int64_t box_blocks = (box_threads + kThreads - 1) / kThreads;
  const int64_t chunk = int64_t{kThreads} * kVectorsPerThread * Vec;
  const int64_t chunks_per_row = (shape.num_anchors + chunk - 1) / chunk;
  const int64_t total_blocks = box_blocks + shape.batch * shape.num_classes * chunks_per_row;
  TORCH_CHECK(total_blocks < (int64_t{1} << 31), "detect_decode: input too large for one launch");
  detect_decode_kernel<scalar_t, RegMax, Vec><<<total_blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      boxes.const_data_ptr<scalar_t>(), scores.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), shape,
      levels, xywh, box_blocks, chunks_per_row);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
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
  const bool vectorize = can_vectorize(boxes, 4) && can_vectorize(scores, 4);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "detect_decode_cuda", [&] {
    if (reg_max == 16) {
      vectorize ? launch<scalar_t, 16, 4>(boxes, scores, out, shape, levels, xywh)
                : launch<scalar_t, 16, 1>(boxes, scores, out, shape, levels, xywh);
    } else {
      vectorize ? launch<scalar_t, 1, 4>(boxes, scores, out, shape, levels, xywh)
                : launch<scalar_t, 1, 1>(boxes, scores, out, shape, levels, xywh);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(yolo_fastdetect, CUDA, m) { m.impl("detect_decode", &detect_decode_cuda); }

}  // namespace yolo_fastdetect
