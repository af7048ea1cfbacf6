// fp32 linears over a few token rows (CPU): y = x w^T (+ b) with each weight row read from memory once.
//
// At decode sizes a linear is a matrix-vector product bound by how fast the weights stream from
// memory, and the BLAS reads them at a fraction of the bandwidth a plain sum reaches on one core
// (benchmarks/linear_kernel.py). Up to four rows: each pass takes R consecutive weight rows and every
// x row at once (R * M accumulators of 8 lanes, fused multiply-adds), so a weight element is loaded
// once per call, and the horizontal sums happen once per output. Five to MAX_ROWS rows: 8 weight rows
// at a time, kept in L1 while every group of four x rows passes over them. More than MAX_ROWS rows
// (where the BLAS's GEMM measured as fast or faster), another dtype, a strided weight or a width that
// is not a multiple of 8: at::linear.
//
// Built with the other CPU kernels by engine/cpu_kernels.py; work is split over output rows with
// at::parallel_for (torch's intra-op threads).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

constexpr int64_t MAX_ROWS = 16;  // engine/cpu_kernels.py GEMV_MAX_ROWS

#ifdef __AVX2__
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[m, n] for m < M and n in [n0, n1): R weight rows per pass (K % 8 == 0)
template <int M, int R>
void rows(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    __m256 acc[M][R];
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
    const float* wn = w + n * K;
    for (int64_t k = 0; k < K; k += 8) {
      __m256 xv[M];
      for (int m = 0; m < M; ++m) xv[m] = _mm256_loadu_ps(x + m * K + k);
      for (int r = 0; r < R; ++r) {
        const __m256 wv = _mm256_loadu_ps(wn + r * K + k);
        for (int m = 0; m < M; ++m) acc[m][r] = _mm256_fmadd_ps(wv, xv[m], acc[m][r]);
      }
    }
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) y[m * N + n + r] = hsum(acc[m][r]);
  }
  if (n < n1) rows<M, 1>(x, w, y, K, N, n, n1);  // the last rows of the range, one at a time
}
#else
template <int M, int R>
void rows(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int m = 0; m < M; ++m) {
      const float* a = x + m * K;
      const float* b = w + n * K;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
      y[m * N + n] = s;
    }
}
#endif

inline void token_rows(int64_t M, const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  switch (M) {
    case 1: rows<1, 8>(x, w, y, K, N, n0, n1); break;
    case 2: rows<2, 4>(x, w, y, K, N, n0, n1); break;
    case 3: rows<3, 2>(x, w, y, K, N, n0, n1); break;
    default: rows<4, 2>(x, w, y, K, N, n0, n1); break;
  }
}

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  TORCH_CHECK(w.dim() == 2 && x.size(-1) == w.size(1), "small_linear: x [..., ", x.size(-1),
              "] does not match the weight ", w.sizes());
  const int64_t K = w.size(1), N = w.size(0), M = x.numel() / std::max<int64_t>(K, 1);
  if (M > MAX_ROWS || M == 0 || K % 8 != 0 || x.scalar_type() != at::kFloat || w.scalar_type() != at::kFloat ||
      !w.is_contiguous())
    return at::linear(x, w, b);
  const at::Tensor xc = x.contiguous();
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  at::Tensor y = at::empty(shape, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // tasks of whole 8-row groups, each at least ~128 KiB of weights
  const int64_t groups = (N + 7) / 8, grain = std::max<int64_t>(1, 4096 / K);
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    const int64_t n0 = g0 * 8, n1 = std::min(N, g1 * 8);
    // 8 weight rows at a time (in L1 for the second and later groups) against every group of 4 x rows
    for (int64_t n = n0; n < n1; n += 8) {
      const int64_t e = std::min(n1, n + 8);
      for (int64_t m = 0; m < M; m += 4) token_rows(std::min<int64_t>(4, M - m), xp + m * K, wp, yp + m * N, K, N, n, e);
    }
  });
  if (b.has_value() && b->defined()) y.add_(*b);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferledger_cpu, m) {
  m.def("small_linear(Tensor x, Tensor w, Tensor? b) -> Tensor");
  m.impl("small_linear", c10::DispatchKey::CPU, TORCH_FN(small_linear));
}
