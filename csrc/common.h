// Helpers shared by every operator: device math, and the text of numbers in error messages.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#if defined(__CUDACC__)
#define YFD_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define YFD_HOST_DEVICE inline
#endif

namespace yolo_fastdetect {

// a * b and a + b each rounded on their own. CUDA contracts a * b + c into one FMA by default and the CPU build
// (-ffp-contract=off) does not; geometry that decides which pixels a kernel reads goes through these so that both
// devices compute it bit for bit alike.
template <typename T>
YFD_HOST_DEVICE T mul_rounded(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == sizeof(double)) return __dmul_rn(a, b);
  else return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

template <typename T>
YFD_HOST_DEVICE T add_rounded(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == sizeof(double)) return __dadd_rn(a, b);
  else return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

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

// Text of numbers and shapes for error messages. Checks (TORCH_CHECK and co.) pass this text instead of the
// number: streaming a number, or an ArrayRef (whose operator<< streams numbers), from inside this library runs
// the library's own copy of libstdc++'s number formatting (num_put), which the process's libstdc++ never
// initialised; with torch's cu130 wheel the failing check then segfaults instead of raising. Strings,
// ScalarType and Device stream safely.
template <typename Integer, std::enable_if_t<std::is_integral_v<Integer>, int> = 0>
inline std::string text(Integer value) {
  return std::to_string(value);
}

// As an ostream prints a double: 0.5, -1e-07, nan.
inline std::string text(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", value);
  return buffer;
}

// As torch prints sizes: [2, 3, 4].
inline std::string text(c10::IntArrayRef values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

}  // namespace yolo_fastdetect
