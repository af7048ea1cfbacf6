// The CPU step's own linears: y = x w^T (+ b).
//
// small_linear: fp32 over a few token rows, each weight row read from memory once.
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
// panel_linear: bf16 (fp32 accumulation) over any number of token rows, where the CPU has the AVX-512
// BF16 dot product. The weight is repacked once (engine/cpu_linear.py) into panels of 16 output rows,
// [N / 16, K / 2, 16, 2]: element [p, k, j, t] is w[16 p + j, 2 k + t]. One 64-byte load then holds
// 16 outputs' weights for two k, vdpbf16ps multiplies them with the pair x[m, 2k], x[m, 2k + 1]
// broadcast to every lane and adds both products into 16 fp32 lanes, one per output: no horizontal
// sums, and each panel is one sequential stream. A tile is 4 panels (64 outputs) by up to 4 token
// rows; a task is a run of 4-panel blocks, and every group of 4 rows passes over a block while it is
// in L2, fetching its share of the next block into L2 along the way (the first of G groups the first
// G-th of each panel's k, and so on: each line asked for once, evenly over the block's passes). Each
// output is rounded to bf16 once (round to nearest even), as oneDNN's bf16 linear does.
//
// Built with the other CPU kernels by engine/cpu_kernels.py; work is split over output rows with
// at::parallel_for (torch's intra-op threads).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstring>

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


#ifdef __AVX512BF16__
constexpr bool PANEL_KERNEL = true;

// y[m, 16 (p0 + q) + j] for m < MT, q < PT: rows x (stride K), panels starting at p (each K * 16 elements)
// (bias: the 16 PT biases from b, or none), the bias added in fp32 before the one rounding
// pf: where in the next block's 4 panels this tile's share starts, one 64-byte line of each panel fetched
// into L2 every `every` pairs of k (nullptr: none)
template <int MT, int PT>
void panel_tile(const c10::BFloat16* x, const c10::BFloat16* p, const c10::BFloat16* b, c10::BFloat16* y, int64_t K,
                int64_t N, const c10::BFloat16* pf, int64_t every) {
  __m512 acc[MT][PT];
  for (int q = 0; q < PT; ++q) {
    const __m512 init = b ? _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + q * 16)))
                          : _mm512_setzero_ps();
    for (int m = 0; m < MT; ++m) acc[m][q] = init;
  }
  const int64_t panel = K * 16;
  int64_t wait = every;
  for (int64_t k = 0; k < K; k += 2) {
    __m512bh wv[PT];
    for (int q = 0; q < PT; ++q) wv[q] = (__m512bh)_mm512_loadu_si512(p + q * panel + k * 16);
    if (pf && --wait == 0) {
      wait = every;
      for (int q = 0; q < 4; ++q) _mm_prefetch(reinterpret_cast<const char*>(pf + q * panel), _MM_HINT_T1);
      pf += 32;  // the next pair of k: 16 outputs x 2
    }
    for (int m = 0; m < MT; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * K + k, sizeof pair);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int q = 0; q < PT; ++q) acc[m][q] = _mm512_dpbf16_ps(acc[m][q], wv[q], xv);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int q = 0; q < PT; ++q)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * N + q * 16), (__m256i)_mm512_cvtneps_pbh(acc[m][q]));
}

template <int MT>
void panel_rows(int64_t pt, const c10::BFloat16* x, const c10::BFloat16* p, const c10::BFloat16* b, c10::BFloat16* y,
                int64_t K, int64_t N, const c10::BFloat16* pf, int64_t every) {
  switch (pt) {
    case 1: panel_tile<MT, 1>(x, p, b, y, K, N, pf, every); break;
    case 2: panel_tile<MT, 2>(x, p, b, y, K, N, pf, every); break;
    case 3: panel_tile<MT, 3>(x, p, b, y, K, N, pf, every); break;
    default: panel_tile<MT, 4>(x, p, b, y, K, N, pf, every); break;
  }
}

void panel_block(int64_t mt, int64_t pt, const c10::BFloat16* x, const c10::BFloat16* p, const c10::BFloat16* b,
                 c10::BFloat16* y, int64_t K, int64_t N, const c10::BFloat16* pf, int64_t every) {
  switch (mt) {
    case 1: panel_rows<1>(pt, x, p, b, y, K, N, pf, every); break;
    case 2: panel_rows<2>(pt, x, p, b, y, K, N, pf, every); break;
    case 3: panel_rows<3>(pt, x, p, b, y, K, N, pf, every); break;
    default: panel_rows<4>(pt, x, p, b, y, K, N, pf, every); break;
  }
}
#else
constexpr bool PANEL_KERNEL = false;
#endif

at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& p, const c10::optional<at::Tensor>& b) {
  TORCH_CHECK(PANEL_KERNEL, "panel_linear: this build has no AVX-512 BF16 (the CPU does not multiply bf16 natively)");
  TORCH_CHECK(p.dim() == 4 && p.size(2) == 16 && p.size(3) == 2 && p.is_contiguous(),
              "panel_linear: the weight must be packed as [N / 16, K / 2, 16, 2], not ", p.sizes());
  const int64_t K = p.size(1) * 2, N = p.size(0) * 16;
  TORCH_CHECK(x.size(-1) == K, "panel_linear: x [..., ", x.size(-1), "] does not match the packed weight's K ", K);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && p.scalar_type() == at::kBFloat16, "panel_linear: bfloat16 only");
  const bool has_bias = b.has_value() && b->defined();
  TORCH_CHECK(!has_bias || (b->scalar_type() == at::kBFloat16 && b->dim() == 1 && b->size(0) == N),
              "panel_linear: the bias must be bfloat16 [", N, "]");
  const at::Tensor bc = has_bias ? b->contiguous() : at::Tensor();
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.numel() / std::max<int64_t>(K, 1);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  at::Tensor y = at::empty(shape, x.options());
#ifdef __AVX512BF16__
  const auto* xp = xc.data_ptr<c10::BFloat16>();
  const auto* pp = p.data_ptr<c10::BFloat16>();
  auto* yp = y.data_ptr<c10::BFloat16>();
  const c10::BFloat16* bp = has_bias ? bc.data_ptr<c10::BFloat16>() : nullptr;
  const int64_t panels = N / 16, blocks = (panels + 3) / 4;
  // tasks of whole 4-panel blocks, each at least ~128 KiB of weights
  const int64_t grain = std::max<int64_t>(1, 131072 / (4 * K * 16 * 2));
  // the G groups of rows share the fetching of the next block: group g the g-th span of each panel's K / 2
  // pairs of k, a line every G pairs
  const int64_t groups = (M + 3) / 4, span = (K / 2 + groups - 1) / groups;
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t q0 = blk * 4, pt = std::min<int64_t>(4, panels - q0);
      // the next full block is asked for while this one is in L2, so the memory keeps streaming while
      // the rows compute (measured 6-14 % faster at 16 rows, up to 20 % at one, than no fetching; shared
      // out over the groups, 7-13 % faster at 16 rows and 8-14 % at 64 than every group fetching it all)
      const c10::BFloat16* next = q0 + 8 <= panels ? pp + (q0 + 4) * K * 16 : nullptr;
      for (int64_t m = 0, g = 0; m < M; m += 4, ++g)
        panel_block(std::min<int64_t>(4, M - m), pt, xp + m * K, pp + q0 * K * 16, bp ? bp + q0 * 16 : nullptr,
                    yp + m * N + q0 * 16, K, N, next ? next + g * span * 32 : nullptr, groups);
    }
  });
#endif
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferledger_cpu, m) {
  m.def("small_linear(Tensor x, Tensor w, Tensor? b) -> Tensor");
  m.impl("small_linear", c10::DispatchKey::CPU, TORCH_FN(small_linear));
  m.def("panel_linear(Tensor x, Tensor p, Tensor? b) -> Tensor");
  m.def("panel_kernel_built() -> bool", [] { return PANEL_KERNEL; });
  m.impl("panel_linear", c10::DispatchKey::CPU, TORCH_FN(panel_linear));
}
