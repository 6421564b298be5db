// RoIAlign on the GPU: the NCHW <-> NHWC relayout of a feature map (forward) or of a gradient buffer (backward), as a
// tiled transpose whose end lets the pooling kernel start early (programmatic dependent launch).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <type_traits>

#include "../common/cuda_primitives.cuh"

namespace yolo_fastdetect {
namespace roi_align {

constexpr int kTransposeTile = 64;
constexpr int kTransposeThreads = 256;

// Each image of `in` is a (rows, cols) matrix; out gets its transpose, cast to out_t. A block moves a 64 x 64 tile
// through shared memory so that the reads (along cols) and the writes (along rows) are both coalesced, V elements
// at a time as one vector (V divides rows and cols).
template <typename in_t, typename out_t, int V>
__global__ void __launch_bounds__(kTransposeThreads)
    transpose_kernel(const in_t* __restrict__ in, out_t* __restrict__ out, int64_t rows, int64_t cols) {
  // A kernel launched as this one's programmatic dependent (the pooling kernel, forward) may start once every block
  // of this grid has started, rather than exited: its blocks take the SMs that this grid's last wave leaves idle and
  // tabulate their taps there; they wait for this grid's completion before they read its output.
  allow_dependent_launch();
  constexpr int kVectorsPerLine = kTransposeTile / V;
  __shared__ out_t tile[kTransposeTile][kTransposeTile + 1];  // +1: spreads the column accesses over the banks
  const int64_t image_offset = static_cast<int64_t>(blockIdx.z) * rows * cols;
  in += image_offset;
  out += image_offset;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kTransposeTile;
  const int64_t first_col = static_cast<int64_t>(blockIdx.x) * kTransposeTile;
  // All of a thread's loads first, then the stores into the tile: the loads are in flight together (a load followed
  // by its store, pass by pass, kept one 16-byte load in flight per thread, and the transpose was slower; see
  // benchmarks/RESULTS.md, RoIAlign, for its time).
  constexpr int kPasses = kTransposeTile * kVectorsPerLine / kTransposeThreads;
  static_assert(kPasses * kTransposeThreads == kTransposeTile * kVectorsPerLine, "whole passes over the tile");
  Packet<in_t, V> packets[kPasses];
  bool inside[kPasses];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int i = threadIdx.x + pass * kTransposeThreads, r = i / kVectorsPerLine, c = i % kVectorsPerLine * V;
    const int64_t row = first_row + r, col = first_col + c;
    inside[pass] = row < rows && col < cols;
    // Read once: evict-first, so that the L2 cache keeps the output (which the pooling kernel reads next).
    if (inside[pass]) packets[pass] = load_packet<in_t, V, true>(in + row * cols + col);
  }
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int i = threadIdx.x + pass * kTransposeThreads, r = i / kVectorsPerLine, c = i % kVectorsPerLine * V;
    if (!inside[pass]) continue;
#pragma unroll
    for (int v = 0; v < V; ++v) tile[r][c + v] = static_cast<out_t>(packets[pass].value[v]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kTransposeTile * kVectorsPerLine; i += kTransposeThreads) {
    const int c = i / kVectorsPerLine, r = i % kVectorsPerLine * V;
    const int64_t row = first_row + r, col = first_col + c;
    if (row >= rows || col >= cols) continue;
    Packet<out_t, V> packet;
#pragma unroll
    for (int v = 0; v < V; ++v) packet.value[v] = tile[r + v][c];
    *reinterpret_cast<Packet<out_t, V>*>(out + col * rows + row) = packet;
  }
}

// `map` (N, C, H, W) copied into a new tensor of out_t in memory `format`. A dense NCHW map going channels-last, or
// a dense channels-last map going NCHW, takes the tiled transpose (at::Tensor::copy_ takes a generic strided path
// for those, several times slower), in vectors of at most kMaxBytes; anything else takes copy_.
template <int kMaxBytes, typename in_t, typename out_t>
at::Tensor relayout(const at::Tensor& map, at::ScalarType out_dtype, at::MemoryFormat format, cudaStream_t stream) {
  at::Tensor out = at::empty(map.sizes(), map.options().dtype(out_dtype).memory_format(format));
  const bool to_channels_last = format == at::MemoryFormat::ChannelsLast;
  const bool transposes = to_channels_last ? map.is_contiguous() : map.is_contiguous(at::MemoryFormat::ChannelsLast);
  const int64_t batch = map.size(0), channels = map.size(1), pixels = map.size(2) * map.size(3);
  const int64_t rows = to_channels_last ? channels : pixels, cols = to_channels_last ? pixels : channels;
  const int64_t grid_x = (cols + kTransposeTile - 1) / kTransposeTile;
  const int64_t grid_y = (rows + kTransposeTile - 1) / kTransposeTile;
  if (!transposes || grid_x >= (int64_t{1} << 31) || grid_y > 65535 || batch > 65535) return out.copy_(map);
  // The widest vector (of the wider type) that divides both sides; the allocations are aligned.
  using wider_t = std::conditional_t<(sizeof(in_t) > sizeof(out_t)), in_t, out_t>;
  int width = kMaxBytes / static_cast<int>(sizeof(wider_t));
  while (width > 1 && (rows % width != 0 || cols % width != 0 ||
                       reinterpret_cast<uintptr_t>(map.const_data_ptr()) % (width * sizeof(in_t)) != 0))
    width /= 2;
  with_packet_width<kMaxBytes, wider_t>(width, [&](auto packet) {
    transpose_kernel<in_t, out_t, decltype(packet)::value>
        <<<dim3(grid_x, grid_y, batch), kTransposeThreads, 0, stream>>>(map.const_data_ptr<in_t>(),
                                                                        out.mutable_data_ptr<out_t>(), rows, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace roi_align
}  // namespace yolo_fastdetect
