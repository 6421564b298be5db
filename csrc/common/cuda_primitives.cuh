// Device-side building blocks of the CUDA kernels, shared by the operators: the warp size, packets (V elements moved
// as one aligned vector) and the choice of their width, loads through the read-only path or marked evict-first,
// evict-first stores, vector atomics, and the PTX of programmatic dependent launch. Include from .cu files only.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace yolo_fastdetect {

constexpr int kWarpSize = 32;  // threads of a warp, as lane arithmetic and shuffles count them

// V elements loaded or stored as one aligned vector.
template <typename T, int V>
struct alignas(sizeof(T) * V) Packet {
  T value[V];
};

// Widest packet (at most kMaxBytes) that every map (N, C, H, W) allows: channels-last maps whose channels, strides and
// base address are multiples of it. 1 (one channel per lane, any strides) otherwise.
template <int kMaxBytes, typename element_t>
int packet_width(at::TensorList maps) {
  for (int width = kMaxBytes / static_cast<int>(sizeof(element_t)); width > 1; width /= 2) {
    bool fits = true;
    for (const at::Tensor& map : maps) {
      fits = fits && map.stride(1) == 1 && map.size(1) % width == 0 && map.stride(0) % width == 0 &&
             map.stride(2) % width == 0 && map.stride(3) % width == 0 &&
             reinterpret_cast<uintptr_t>(map.const_data_ptr()) % (width * sizeof(element_t)) == 0;
    }
    if (fits) return width;
  }
  return 1;
}

// Calls launch(std::integral_constant<int, V>) with V = width, instantiating only packets of <= kMaxBytes.
template <int kMaxBytes, typename element_t, typename Launch>
void with_packet_width(int width, Launch&& launch) {
  constexpr int widest = kMaxBytes / static_cast<int>(sizeof(element_t));
  static_assert(widest <= 8, "packets of at most 8 elements");
  if constexpr (widest >= 8) {
    if (width == 8) return launch(std::integral_constant<int, 8>());
  }
  if constexpr (widest >= 4) {
    if (width == 4) return launch(std::integral_constant<int, 4>());
  }
  if (width == 2) return launch(std::integral_constant<int, 2>());
  launch(std::integral_constant<int, 1>());
}

// The packet at `address` (of a map the kernel only reads) in 16-byte or smaller pieces: through the read-only data
// path (ld.global.nc), or marked evict-first (ld.global.cs) for data read once.
template <typename T, int V, bool kEvictFirst = false>
__device__ __forceinline__ Packet<T, V> load_packet(const T* address) {
  const auto load = [](const auto* piece) {
    if constexpr (kEvictFirst) return __ldcs(piece);
    else return __ldg(piece);
  };
  Packet<T, V> packet;
  constexpr int kBytes = sizeof(packet);
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i)
      reinterpret_cast<uint4*>(&packet)[i] = load(reinterpret_cast<const uint4*>(address) + i);
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(&packet) = load(reinterpret_cast<const uint2*>(address));
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<unsigned int*>(&packet) = load(reinterpret_cast<const unsigned int*>(address));
  } else {
    static_assert(kBytes == 2, "packets of 2, 4, 8 or a multiple of 16 bytes");
    *reinterpret_cast<unsigned short*>(&packet) = load(reinterpret_cast<const unsigned short*>(address));
  }
  return packet;
}

// Adds values[v] to address[v] for every v, atomically.
template <int V>
__device__ __forceinline__ void atomic_add_packet(float* address, const float (&values)[V]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (V % 4 == 0) {  // sm_90 adds a float4 in one instruction
#pragma unroll
    for (int v = 0; v < V; v += 4)
      atomicAdd(reinterpret_cast<float4*>(address + v),
                make_float4(values[v], values[v + 1], values[v + 2], values[v + 3]));
  } else
#endif
  {
#pragma unroll
    for (int v = 0; v < V; ++v) atomicAdd(address + v, values[v]);
  }
}

template <int V>
__device__ __forceinline__ void atomic_add_packet(double* address, const double (&values)[V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) atomicAdd(address + v, values[v]);
}

// An element's bits as one unsigned integer of its size, for the cache-hinted stores.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 2, unsigned short,
                                std::conditional_t<sizeof(T) == 4, unsigned int, unsigned long long>>;

// A store marked evict-first (st.global.cs): for data written once and not read again by this kernel, such as the
// pooled output (50 MB for the benchmark's float32 case), so that it does not push the maps out of the L2 cache.
template <typename T>
__device__ __forceinline__ void store_evict_first(T* address, T value) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "elements of 2, 4 or 8 bytes");
  Bits<T> bits;
  memcpy(&bits, &value, sizeof(T));
  __stcs(reinterpret_cast<Bits<T>*>(address), bits);
}

// Waits until the kernel that this one was launched as a programmatic dependent of has finished and its writes are
// visible; returns at once after a plain launch.
__device__ __forceinline__ void wait_for_preceding_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the grid launched as this one's programmatic dependent start before this one exits; no-op otherwise.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

}  // namespace yolo_fastdetect
