// exp(x) for x <= 0, shared by the kernels (paged_attention.cpp's softmax, sampling.cpp's draw).
#pragma once

#include <cstdint>

namespace inferledger_cpu_math {

// exp(x) for the softmax's x <= 0, in a form the compiler vectorises (no call): 2^n * p(r) with
// x = n ln2 + r, |r| <= ln2 / 2, p the degree-6 Taylor polynomial (relative error under 2e-7); 0 below -87
inline float exp_neg(float x) {
  const float lo = -87.0f;
  const float xc = x < lo ? lo : x;
  // round to nearest by adding and taking back 1.5 * 2^23 (plain arithmetic, so the loop vectorises)
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  __builtin_memcpy(&two_n, &bits, sizeof two_n);
  return x < lo ? 0.0f : p * two_n;
}

}  // namespace inferledger_cpu_math
