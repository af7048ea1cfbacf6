// Attention over the engine's paged KV cache, read in place (CPU).
//
// The cache of one layer is [num_blocks, n_kv_heads, block_size, head_dim] (engine/attention.py);
// query row t belongs to the sequence whose block table is tables[q_seq[t]] and sees the keys at
// positions 0 .. q_ctx[t] - 1 of that sequence. One work item is (query row, KV head): the query
// heads sharing that KV head (grouped-query attention) walk the row's blocks together, so every
// K / V block is read once per item, straight from the cache, and stays in L1 while the group's
// heads use it. Scores, the softmax (online, one block at a time) and the weighted sum of V are
// fp32 whatever the cache's dtype; the output is rounded to q's dtype once, at the end.
//
// Built at run time by engine/paged_kernel.py (g++, -march=native, -fopenmp against torch's own
// OpenMP runtime, so at::parallel_for uses the intra-op threads torch.set_num_threads set).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float* y, float a, const float* x, int64_t n) {
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

template <typename scalar_t>
void run(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& tables,
         const at::Tensor& q_seq, const at::Tensor& q_ctx, double softmax_scale, at::Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KV = k_cache.size(1), BS = k_cache.size(2), W = tables.size(1);
  const int64_t G = H / KV;
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kp = k_cache.data_ptr<scalar_t>();
  const scalar_t* vp = v_cache.data_ptr<scalar_t>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* sp = q_seq.data_ptr<int64_t>();
  const int64_t* cp = q_ctx.data_ptr<int64_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const float sc = static_cast<float>(softmax_scale);

  at::parallel_for(0, T * KV, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), acc(G * D), kbuf(BS * D), vbuf(BS * D), s(BS), m(G), l(G);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / KV, h = item % KV;
      const int64_t ctx = cp[t];
      const int64_t* table = tp + sp[t] * W;
      const scalar_t* qrow = qp + (t * H + h * G) * D;
      for (int64_t i = 0; i < G * D; ++i) qf[i] = static_cast<float>(qrow[i]) * sc;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
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

}  // namespace

TORCH_LIBRARY(inferledger_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor tables, Tensor q_seq, Tensor q_ctx, "
        "float scale) -> Tensor");
  m.impl("paged_attention", c10::DispatchKey::CPU, TORCH_FN(paged_attention));
}
