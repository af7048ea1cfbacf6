// exp(x) for x <= 0, shared by the kernels (paged_attention.cpp's softmax, sampling.cpp's draw).
#pragma once

#include <cstdint>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

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

#ifdef __AVX512F__
// exp_neg on 16 lanes at once, the same steps (each lane equals exp_neg of it where the compiler contracts
// exp_neg's multiply-adds, as -march=native does); -inf gives 0
inline __m512 exp_neg16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f), shift = _mm512_set1_ps(12582912.0f);
  const __m512 xc = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), shift), shift);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), p, _mm512_castsi512_ps(bits));
}
#endif

}  // namespace inferledger_cpu_math
