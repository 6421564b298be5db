// Helpers shared by every operator's device math.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define YFD_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define YFD_HOST_DEVICE inline
#endif

namespace yolo_fastdetect {

// exp(x) in float. On the GPU: the CUDA math library. On the CPU: a branch-free Cephes-style polynomial
// (within 2 ulp of expf for x in [-87, 88]) that the compiler vectorises across loop iterations, which
// a call to libm's expf prevents.
YFD_HOST_DEVICE float fast_expf(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  x = x < -87.33f ? -87.33f : (x > 88.7f ? 88.7f : x);
  // n = round(x / ln 2) through the 1.5 * 2^23 rounding trick; r = x - n ln 2 in two parts for accuracy.
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t exponent_bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &exponent_bits, sizeof(scale));
  return p * scale;
#endif
}

}  // namespace yolo_fastdetect
