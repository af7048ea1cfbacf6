// Attention over the engine's paged KV cache, read in place (CPU).
//
// The cache of one layer is [num_blocks, n_kv_heads, block_size, head_dim] (engine/attention.py);
// query row t belongs to the sequence whose block table is tables[q_seq[t]] and sees the keys at
// positions 0 .. q_ctx[t] - 1 of that sequence. Work items are one KV head of a tile: up to TILE
// consecutive rows of one sequence (a prefill chunk's; a decode is a tile of one row), whose query
// heads sharing that KV head (grouped-query attention) walk the sequence's blocks together, so every
// K / V block is read once per item, straight from the cache. For the common shape (blocks of 16,
// head_dim 64 or 128: `tile_item`) each block's K is transposed once per item and shared by all the
// item's query vectors, whose scores over the block's keys are then 16-wide multiply-adds and whose
// softmax terms are one vector exp: for decodes, faster than dotting each key row in turn at every
// shape benchmarks/paged_attention.py times. Other shapes dot each key row as it lies. Scores, the
// softmax (online, one block at a time) and the weighted sum of V are fp32 whatever the cache's dtype
// (bf16 products are exact in fp32); the output is rounded to q's dtype once, at the end. A bf16
// decode where the CPU has AVX-512 BF16 takes its own path (decode_bf16, below): the same, except that
// its probabilities are rounded to bf16 before they weight V. Each block asks for the next one's K and
// V (the table scatters them, so the hardware's prefetcher cannot guess where) while it is worked on.
//
// Built at run time by engine/cpu_kernels.py (g++, -march=native, -fopenmp against torch's own
// OpenMP runtime, so at::parallel_for uses the intra-op threads torch.set_num_threads set).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "exp_neg.h"

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

namespace {

inline float dot(const float* __restrict__ a, const float* __restrict__ b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float* __restrict__ y, float a, const float* __restrict__ x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

inline void scale(float* y, float a, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

// n values of src as fp32: src itself when it already is, else converted into buf
inline const float* as_float(const float* src, float*, int64_t) { return src; }
inline const float* as_float(const c10::BFloat16* src, float* buf, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    buf[i] = f;
  }
  return buf;
}

using inferledger_cpu_math::exp_neg;  // exp(x) for x <= 0 (exp_neg.h)

struct Args {
  int64_t H, D, KV, BS, W, G;
  const int64_t *tables, *seq, *ctx;
  float scale;
};

constexpr int64_t TILE = 8, QR = 4;

#ifdef __AVX512BF16__
// A bf16 decode (one row: its G_ query heads of KV head h) over blocks of 16 keys where the CPU has AVX-512 BF16,
// in registers throughout. Scores: each key row dotted as it lies in the cache, bf16 pairs multiplied and
// summed into fp32 (vdpbf16ps: the products are exact), the 16 keys' sums of a head reduced together into
// one register of scores (a transpose-and-add tree, not 16 horizontal sums), then times the softmax scale.
// Softmax online in fp32, one block at a time. The weighted sum of V with the same instruction: the
// probabilities rounded to bf16 (as a bf16 batched matmul rounds its operand), V's rows taken two at a
// time and interleaved so each 32-bit lane holds one column's pair, accumulated in fp32; the running
// denominator sums the same rounded probabilities, so the weights still sum to it exactly. Each V load is
// shared by the G_ heads. The output is rounded to bf16 once.
constexpr int64_t DBS = 16;  // the block size decode_bf16 is built for

// lane j of the result = the sum of x[j]'s 16 lanes
inline __m512 sum16(const __m512 (&x)[16]) {
  __m512 y[8], z[4];
  for (int j = 0; j < 8; ++j)
    y[j] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * j], x[2 * j + 1]), _mm512_unpackhi_ps(x[2 * j], x[2 * j + 1]));
  for (int j = 0; j < 4; ++j) {
    const __m512d a = _mm512_castps_pd(y[2 * j]), b = _mm512_castps_pd(y[2 * j + 1]);
    z[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // z[j]: keys 4j .. 4j + 3 in every 128-bit quarter, each quarter a partial sum of its own
  const __m512 u0 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xdd));
  const __m512 u1 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], 0x88), _mm512_shuffle_f32x4(z[2], z[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xdd));
}

template <int64_t G_, int64_t D_>
void decode_bf16(const Args& a, const c10::BFloat16* qp, const c10::BFloat16* kp, const c10::BFloat16* vp,
                 c10::BFloat16* op, int64_t t, int64_t h) {
  constexpr int64_t C = D_ / 32;  // 32 bf16 of a row per 512-bit register
  const int64_t KV = a.KV, ctx = a.ctx[t];
  const int64_t* table = a.tables + a.seq[t] * a.W;
  const c10::BFloat16* q = qp + (t * a.H + h * G_) * D_;
  __m512bh qv[G_][C];
  for (int64_t i = 0; i < G_; ++i)
    for (int64_t c = 0; c < C; ++c) qv[i][c] = (__m512bh)_mm512_loadu_si512(q + i * D_ + c * 32);
  // acc[i][c][0 / 1]: columns c * 32 + 8 * quarter + (0..3 / 4..7) of head i, in each 128-bit quarter
  __m512 acc[G_][C][2];
  float m[G_];
  __m512 l[G_];  // lane j: the sum of the rounded probabilities of the keys in lane j of the blocks
  for (int64_t i = 0; i < G_; ++i) {
    for (int64_t c = 0; c < C; ++c) acc[i][c][0] = acc[i][c][1] = _mm512_setzero_ps();
    m[i] = -std::numeric_limits<float>::infinity();
    l[i] = _mm512_setzero_ps();
  }
  const __m512 scale = _mm512_set1_ps(a.scale), ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t b = 0; b * DBS < ctx; ++b) {
    const int64_t n = std::min(DBS, ctx - b * DBS);
    const int64_t base = (table[b] * KV + h) * DBS * D_;
    const c10::BFloat16 *kb = kp + base, *vb = vp + base;
    // the next block's K and V, wherever the table put it (no stride to predict), into L2 (prefetcht1): a
    // batch-16 step's 30 layers over 500 keys (189 MB of K / V, from memory) 22.9 ms into L1, 19.5 into L2
    if ((b + 1) * DBS < ctx) {
      const int64_t next = (table[b + 1] * KV + h) * DBS * D_;
      for (int64_t off = 0; off < DBS * D_; off += 32) {
        __builtin_prefetch(kp + next + off, 0, 2);
        __builtin_prefetch(vp + next + off, 0, 2);
      }
    }
    const __mmask16 live = static_cast<__mmask16>((1u << n) - 1);  // keys past n: another row's, or never written
    uint32_t pairs[G_][DBS / 2];  // head i's probabilities of keys 2u, 2u + 1 as two bf16
    for (int64_t i = 0; i < G_; ++i) {
      __m512 x[16];
      for (int64_t j = 0; j < DBS; ++j) {
        __m512 s = _mm512_setzero_ps();
        for (int64_t c = 0; c < C; ++c)
          s = _mm512_dpbf16_ps(s, qv[i][c], (__m512bh)_mm512_loadu_si512(kb + j * D_ + c * 32));
        x[j] = s;
      }
      const __m512 sc = _mm512_mask_mov_ps(ninf, live, _mm512_mul_ps(sum16(x), scale));
      const float mx = std::max(m[i], _mm512_reduce_max_ps(sc));
      if (mx > m[i]) {  // a new running maximum: what was summed so far is rescaled to it
        const float corr = exp_neg(m[i] - mx);
        const __m512 cv = _mm512_set1_ps(corr);
        for (int64_t c = 0; c < C; ++c) {
          acc[i][c][0] = _mm512_mul_ps(acc[i][c][0], cv);
          acc[i][c][1] = _mm512_mul_ps(acc[i][c][1], cv);
        }
        l[i] = _mm512_mul_ps(l[i], cv);
        m[i] = mx;
      }
      const __m256bh pb = _mm512_cvtneps_pbh(inferledger_cpu_math::exp_neg16(_mm512_sub_ps(sc, _mm512_set1_ps(mx))));
      l[i] = _mm512_add_ps(l[i], _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)pb), 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs[i]), (__m256i)pb);
    }
    for (int64_t u = 0; 2 * u < n; ++u) {
      const c10::BFloat16* v0 = vb + 2 * u * D_;
      const bool second = 2 * u + 1 < n;
      for (int64_t c = 0; c < C; ++c) {
        const __m512i r0 = _mm512_loadu_si512(v0 + c * 32);
        const __m512i r1 = second ? _mm512_loadu_si512(v0 + D_ + c * 32) : _mm512_setzero_si512();
        const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(r0, r1), hi = (__m512bh)_mm512_unpackhi_epi16(r0, r1);
        for (int64_t i = 0; i < G_; ++i) {
          const __m512bh pp = (__m512bh)_mm512_set1_epi32(static_cast<int>(pairs[i][u]));
          acc[i][c][0] = _mm512_dpbf16_ps(acc[i][c][0], lo, pp);
          acc[i][c][1] = _mm512_dpbf16_ps(acc[i][c][1], hi, pp);
        }
      }
    }
  }
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  c10::BFloat16* o = op + (t * a.H + h * G_) * D_;
  for (int64_t i = 0; i < G_; ++i) {
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(l[i]));
    for (int64_t c = 0; c < C; ++c) {
      const __m512 lo = acc[i][c][0], hi = acc[i][c][1];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i * D_ + c * 32),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_permutex2var_ps(lo, first, hi), inv)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i * D_ + c * 32 + 16),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_permutex2var_ps(lo, second, hi), inv)));
    }
  }
}

// The decode_bf16 built for this group size and head_dim, or nullptr (then the transposed tiles serve)
using DecodeFn = void (*)(const Args&, const c10::BFloat16*, const c10::BFloat16*, const c10::BFloat16*, c10::BFloat16*,
                          int64_t, int64_t);
template <int64_t D_>
DecodeFn decode_for(int64_t G) {
  switch (G) {
    case 1: return decode_bf16<1, D_>;
    case 2: return decode_bf16<2, D_>;
    case 3: return decode_bf16<3, D_>;
    case 4: return decode_bf16<4, D_>;
    default: return nullptr;
  }
}
#endif

// Rows t0 .. t1 - 1 of one sequence (consecutive positions; one row for a decode) and KV head h, for the
// common shape (block_size BS_, head_dim D_ fixed at compile time, so the score and output
// accumulators stay in registers): each block's K is transposed once into [D_][BS_] and shared by
// the tile's (t1 - t0) x G query vectors, taken QR at a time, their scores BS_-wide multiply-adds.

template <int64_t BS_, int64_t D_, typename scalar_t>
void tile_item(const Args& a, const scalar_t* qp, const scalar_t* kp, const scalar_t* vp, scalar_t* op, int64_t t0,
               int64_t t1, int64_t h, float* __restrict__ qf, float* __restrict__ acc, float* __restrict__ kT,
               float* __restrict__ vbuf, float* __restrict__ m, float* __restrict__ l) {
  const int64_t G = a.G, KV = a.KV, rows = (t1 - t0) * G;
  const int64_t* table = a.tables + a.seq[t0] * a.W;
  int64_t ctx = 0;
  for (int64_t t = t0; t < t1; ++t) ctx = std::max(ctx, a.ctx[t]);
  for (int64_t t = t0; t < t1; ++t) {
    const scalar_t* qrow = qp + (t * a.H + h * G) * D_;
    for (int64_t i = 0; i < G * D_; ++i) qf[(t - t0) * G * D_ + i] = static_cast<float>(qrow[i]) * a.scale;
  }
  std::fill(acc, acc + rows * D_, 0.f);
  std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
  std::fill(l, l + rows, 0.f);
  for (int64_t b = 0; b * BS_ < ctx; ++b) {
    const int64_t n = std::min(BS_, ctx - b * BS_);
    const int64_t base = (table[b] * KV + h) * BS_ * D_;
    const scalar_t* kb = kp + base;
    if ((b + 1) * BS_ < ctx) {  // the next block's K and V, wherever the table put it: no stride to predict
      const int64_t next = (table[b + 1] * KV + h) * BS_ * D_;
      for (int64_t off = 0; off < BS_ * D_; off += 64 / static_cast<int64_t>(sizeof(scalar_t))) {
        __builtin_prefetch(kp + next + off);
        __builtin_prefetch(vp + next + off);
      }
    }
    for (int64_t j = 0; j < BS_; ++j)
        for (int64_t d = 0; d < D_; ++d) kT[d * BS_ + j] = j < n ? static_cast<float>(kb[j * D_ + d]) : 0.f;
    const float* vb = as_float(vp + base, vbuf, n * D_);
    for (int64_t r0 = 0; r0 < rows; r0 += QR) {
      float sc[QR][BS_] = {};
#pragma GCC unroll 4
      for (int64_t d = 0; d < D_; ++d) {
        const float* kd = kT + d * BS_;
#pragma GCC unroll 4
        for (int64_t i = 0; i < QR; ++i) {
          const float qd = r0 + i < rows ? qf[(r0 + i) * D_ + d] : 0.f;
#pragma omp simd
          for (int64_t j = 0; j < BS_; ++j) sc[i][j] += qd * kd[j];
        }
      }
      for (int64_t i = 0; i < QR && r0 + i < rows; ++i) {
        const int64_t r = r0 + i;
        const int64_t keys = std::min(n, a.ctx[t0 + r / G] - b * BS_);  // this row's causal limit here
        if (keys <= 0) continue;
        float* sr = sc[i];
        float mx = m[r];
        for (int64_t j = 0; j < keys; ++j) mx = std::max(mx, sr[j]);
        float* ar = acc + r * D_;
        float corr = 1.f;
        if (mx > m[r]) {
          corr = exp_neg(m[r] - mx);
          m[r] = mx;
        }
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < BS_; ++j) {
          sr[j] = j < keys ? exp_neg(sr[j] - mx) : 0.f;
          sum += sr[j];
        }
        l[r] = l[r] * corr + sum;
        float o[D_];
#pragma omp simd
        for (int64_t d = 0; d < D_; ++d) o[d] = ar[d] * corr;
        for (int64_t j = 0; j < keys; ++j) {
          const float pj = sr[j];
          const float* vj = vb + j * D_;
#pragma omp simd
          for (int64_t d = 0; d < D_; ++d) o[d] += pj * vj[d];
        }
#pragma omp simd
        for (int64_t d = 0; d < D_; ++d) ar[d] = o[d];
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    scalar_t* orow = op + ((t0 + r / G) * a.H + h * G + r % G) * D_;
    const float inv = 1.0f / l[r];
    for (int64_t d = 0; d < D_; ++d) orow[d] = static_cast<scalar_t>(acc[r * D_ + d] * inv);
  }
}

template <typename scalar_t>
void run(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& tables,
         const at::Tensor& q_seq, const at::Tensor& q_ctx, double softmax_scale, at::Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KV = k_cache.size(1), BS = k_cache.size(2), W = tables.size(1);
  const Args a{H, D, KV, BS, W, H / KV, tables.data_ptr<int64_t>(), q_seq.data_ptr<int64_t>(),
               q_ctx.data_ptr<int64_t>(), static_cast<float>(softmax_scale)};
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kp = k_cache.data_ptr<scalar_t>();
  const scalar_t* vp = v_cache.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const bool tiled = BS == 16 && (D == 64 || D == 128);  // the shapes tile_item is built for
  void (*decode)(const Args&, const scalar_t*, const scalar_t*, const scalar_t*, scalar_t*, int64_t, int64_t) = nullptr;
#ifdef __AVX512BF16__
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>)
    if (BS == DBS) decode = D == 64 ? decode_for<64>(a.G) : D == 128 ? decode_for<128>(a.G) : nullptr;
#endif

  std::vector<int64_t> tiles;  // the first row of each tile, then T
  for (int64_t t = 0; t < T; ++t)
    if (t == 0 || !tiled || a.seq[t] != a.seq[t - 1] || t - tiles.back() == TILE) tiles.push_back(t);
  tiles.push_back(T);
  const int64_t n_tiles = static_cast<int64_t>(tiles.size()) - 1;

  at::parallel_for(0, n_tiles * KV, 1, [&](int64_t begin, int64_t end) {
    const int64_t G = a.G, most = TILE * G;
    std::vector<float> qf(most * D), acc(most * D), kbuf(BS * D), vbuf(BS * D), s(BS), m(most), l(most);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t0 = tiles[item / KV], t1 = tiles[item / KV + 1], h = item % KV;
      if (decode && t1 - t0 == 1) {
        decode(a, qp, kp, vp, op, t0, h);
        continue;
      }
      if (tiled) {
        if (D == 64)
          tile_item<16, 64>(a, qp, kp, vp, op, t0, t1, h, qf.data(), acc.data(), kbuf.data(), vbuf.data(), m.data(),
                            l.data());
        else
          tile_item<16, 128>(a, qp, kp, vp, op, t0, t1, h, qf.data(), acc.data(), kbuf.data(), vbuf.data(), m.data(),
                             l.data());
        continue;
      }
      // another shape (a lone row): the G query heads of the group, each block's K rows dotted as they lie
      const int64_t t = t0, ctx = a.ctx[t];
      const int64_t* table = a.tables + a.seq[t] * W;
      const scalar_t* qrow = qp + (t * H + h * G) * D;
      for (int64_t i = 0; i < G * D; ++i) qf[i] = static_cast<float>(qrow[i]) * a.scale;
      std::fill(acc.begin(), acc.begin() + G * D, 0.f);
      std::fill(m.begin(), m.begin() + G, -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.begin() + G, 0.f);
      for (int64_t b = 0; b * BS < ctx; ++b) {
        const int64_t n = std::min(BS, ctx - b * BS);
        const int64_t base = (table[b] * KV + h) * BS * D;
        const float* kb = as_float(kp + base, kbuf.data(), n * D);
        const float* vb = as_float(vp + base, vbuf.data(), n * D);
        for (int64_t r = 0; r < G; ++r) {
          const float* qr = qf.data() + r * D;
          float* ar = acc.data() + r * D;
          float mx = m[r];
          for (int64_t j = 0; j < n; ++j) {
            s[j] = dot(qr, kb + j * D, D);
            mx = std::max(mx, s[j]);
          }
          if (mx > m[r]) {  // a new running maximum: what was summed so far is rescaled to it
            const float corr = std::exp(m[r] - mx);
            l[r] *= corr;
            scale(ar, corr, D);
            m[r] = mx;
          }
          for (int64_t j = 0; j < n; ++j) {
            const float p = std::exp(s[j] - mx);
            l[r] += p;
            axpy(ar, p, vb + j * D, D);
          }
        }
      }
      scalar_t* orow = op + (t * H + h * G) * D;
      for (int64_t r = 0; r < G; ++r)
        for (int64_t d = 0; d < D; ++d) orow[r * D + d] = static_cast<scalar_t>(acc[r * D + d] / l[r]);
    }
  });
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& tables, const at::Tensor& q_seq, const at::Tensor& q_ctx,
                           double softmax_scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_attention: q [T, H, D], k_cache and v_cache [blocks, KV, block_size, D]");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_attention: q and the caches must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "paged_attention: q and the caches must share one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16,
              "paged_attention: float32 or bfloat16 only");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t NB = k_cache.size(0), KV = k_cache.size(1), BS = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && KV > 0 && H % KV == 0, "paged_attention: head_dim or head counts disagree");
  TORCH_CHECK(tables.dim() == 2 && tables.scalar_type() == at::kLong && tables.is_contiguous(),
              "paged_attention: tables must be a contiguous int64 [sequences, width]");
  TORCH_CHECK(q_seq.dim() == 1 && q_seq.size(0) == T && q_seq.scalar_type() == at::kLong && q_seq.is_contiguous() &&
              q_ctx.dim() == 1 && q_ctx.size(0) == T && q_ctx.scalar_type() == at::kLong && q_ctx.is_contiguous(),
              "paged_attention: q_seq and q_ctx must be contiguous int64 [T]");
  const int64_t S = tables.size(0), W = tables.size(1);
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* sp = q_seq.data_ptr<int64_t>();
  const int64_t* cp = q_ctx.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {  // every block a row reads is checked before any is read
    TORCH_CHECK(sp[t] >= 0 && sp[t] < S, "paged_attention: q_seq[", t, "] = ", sp[t], " is not a row of tables");
    TORCH_CHECK(cp[t] >= 1 && cp[t] <= W * BS, "paged_attention: q_ctx[", t, "] = ", cp[t],
                " is outside [1, ", W * BS, "]");
    for (int64_t b = 0; b * BS < cp[t]; ++b) {
      const int64_t blk = tp[sp[t] * W + b];
      TORCH_CHECK(blk >= 0 && blk < NB, "paged_attention: block ", blk, " of row ", t, " is outside [0, ", NB, ")");
    }
  }
  at::Tensor out = at::empty_like(q);
  if (q.scalar_type() == at::kFloat)
    run<float>(q, k_cache, v_cache, tables, q_seq, q_ctx, softmax_scale, out);
  else
    run<c10::BFloat16>(q, k_cache, v_cache, tables, q_seq, q_ctx, softmax_scale, out);
  return out;
}

// A step's work for one layer in one call: the step's new K / V rows written into the layer's cache
// (row r of k and v, as [rows, D], to row rows[r] of the cache viewed as [blocks * KV * block_size,
// D]), then paged_attention over it. The engine calls it once per layer; the same work as separate
// torch operators cost about 50 us of dispatch a layer, a tenth of a compiled batch-1 step.
at::Tensor paged_attention_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_caches,
                                 const at::Tensor& v_caches, int64_t layer, const at::Tensor& rows,
                                 const at::Tensor& tables, const at::Tensor& q_seq, const at::Tensor& q_ctx,
                                 double softmax_scale) {
  TORCH_CHECK(k_caches.dim() == 5 && v_caches.sizes() == k_caches.sizes() && k_caches.is_contiguous() &&
                  v_caches.is_contiguous() && layer >= 0 && layer < k_caches.size(0),
              "paged_attention_write: caches [layers, blocks, KV, block_size, D], contiguous, and a layer of them");
  const at::Tensor kc = k_caches.select(0, layer), vc = v_caches.select(0, layer);
  const int64_t D = kc.size(-1), slots = kc.numel() / D;
  const auto dt = kc.scalar_type();
  const at::Tensor kr = k.reshape({-1, D}).to(dt).contiguous(), vr = v.reshape({-1, D}).to(dt).contiguous();
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous() && rows.size(0) == kr.size(0) &&
                  vr.size(0) == kr.size(0),
              "paged_attention_write: rows must be a contiguous int64 [", kr.size(0), "], one per new K / V row");
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t bytes = D * kc.element_size();
  auto* kd = static_cast<char*>(kc.data_ptr());
  auto* vd = static_cast<char*>(vc.data_ptr());
  const auto* ks = static_cast<const char*>(kr.data_ptr());
  const auto* vs = static_cast<const char*>(vr.data_ptr());
  for (int64_t r = 0; r < kr.size(0); ++r)  // every row checked before any is written
    TORCH_CHECK(rp[r] >= 0 && rp[r] < slots, "paged_attention_write: rows[", r, "] = ", rp[r], " is outside [0, ", slots, ")");
  for (int64_t r = 0; r < kr.size(0); ++r) {
    std::memcpy(kd + rp[r] * bytes, ks + r * bytes, bytes);
    std::memcpy(vd + rp[r] * bytes, vs + r * bytes, bytes);
  }
  at::Tensor out = paged_attention(q.to(dt).contiguous(), kc, vc, tables, q_seq, q_ctx, softmax_scale);
  return out.scalar_type() == q.scalar_type() ? out : out.to(q.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferledger_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor tables, Tensor q_seq, Tensor q_ctx, "
        "float scale) -> Tensor");
  m.impl("paged_attention", c10::DispatchKey::CPU, TORCH_FN(paged_attention));
  m.def("paged_attention_write(Tensor q, Tensor k, Tensor v, Tensor(a!) k_caches, Tensor(b!) v_caches, int layer, "
        "Tensor rows, Tensor tables, Tensor q_seq, Tensor q_ctx, float scale) -> Tensor");
  m.impl("paged_attention_write", c10::DispatchKey::CPU, TORCH_FN(paged_attention_write));
}
