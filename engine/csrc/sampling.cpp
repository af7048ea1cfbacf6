// Choosing tokens for a step's rows (CPU). `argmax_rows`: every greedy row's argmax in one call, as
// torch.argmax chooses it (0.65 ms for 16 rows over a 49,152-token vocabulary on one core in torch).
// `sample_rows`: one call for every row that samples from its plain
// tempered distribution (no top-k, no top-p, nothing masked), in place of a softmax, a float64 cumulative
// sum and a search per row in torch (about 0.12 ms a row over a 49,152-token vocabulary on one core).
//
// Row r's weights are exp((x_i - max) / T_r) (fp32, the vector exp_neg of exp_neg.h), summed in
// blocks of BLOCK tokens; u_r (drawn by the caller from the row's own generator, so a seed reproduces a
// draw whatever else shares the batch) picks the first token whose cumulative weight exceeds u_r times the
// total: the blocks' sums find its block, one walk of that block finds the token. A token of weight zero
// is never drawn. A row whose weights hold a NaN or sum to no positive finite total gives -1.
//
// Built with the other kernels by engine/cpu_kernels.py.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "exp_neg.h"

namespace {

using inferledger_cpu_math::exp_neg;  // exp(x) for x <= 0 (exp_neg.h): relative error under 2e-7

constexpr int64_t BLOCK = 512;

int64_t draw_row(const float* row, int64_t V, float inv_t, double u) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, row[i]);
  if (!std::isfinite(mx)) return -1;  // a NaN anywhere makes the total NaN below
  const int64_t nb = (V + BLOCK - 1) / BLOCK;
  std::vector<double> sums(nb);
  double total = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    float acc = 0.f;
    const int64_t e = std::min(V, (b + 1) * BLOCK);
#pragma omp simd reduction(+ : acc)
    for (int64_t i = b * BLOCK; i < e; ++i) acc += exp_neg((row[i] - mx) * inv_t);
    sums[b] = acc;
    total += acc;
  }
  if (!(total > 0.0) || !std::isfinite(total)) return -1;
  const double target = u * total;
  double before = 0.0;
  int64_t b = 0;
  while (b < nb - 1 && before + sums[b] <= target) before += sums[b++];
  while (b > 0 && sums[b] == 0.0) before -= sums[--b];  // a block past the total by rounding: back to one with weight
  int64_t last = -1;
  double c = before;
  for (int64_t i = b * BLOCK, e = std::min(V, (b + 1) * BLOCK); i < e; ++i) {
    const float w = exp_neg((row[i] - mx) * inv_t);
    if (w > 0.f) {
      last = i;
      c += w;
      if (c > target) return i;
    }
  }
  return last;  // target at the block's end by rounding: its last token with weight
}

// logits [R, V] fp32 (contiguous rows), inv_temperature [R] fp32 (> 0), u [R] float64 in [0, 1) -> tokens [R]
at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& inv_temperature, const at::Tensor& u) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous() && logits.is_cpu(),
              "sample_rows: logits must be a contiguous fp32 [rows, vocab] on the CPU");
  const int64_t R = logits.size(0), V = logits.size(1);
  TORCH_CHECK(V > 0, "sample_rows: an empty vocabulary");
  TORCH_CHECK(inv_temperature.dim() == 1 && inv_temperature.size(0) == R && inv_temperature.scalar_type() == at::kFloat &&
                  inv_temperature.is_contiguous(),
              "sample_rows: inv_temperature must be a contiguous fp32 [rows]");
  TORCH_CHECK(u.dim() == 1 && u.size(0) == R && u.scalar_type() == at::kDouble && u.is_contiguous(),
              "sample_rows: u must be a contiguous float64 [rows]");
  const float* x = logits.data_ptr<float>();
  const float* it = inv_temperature.data_ptr<float>();
  const double* up = u.data_ptr<double>();
  for (int64_t r = 0; r < R; ++r)
    TORCH_CHECK(it[r] > 0.f && std::isfinite(it[r]) && up[r] >= 0.0 && up[r] < 1.0,
                "sample_rows: row ", r, " has inv_temperature ", it[r], " or u ", up[r], " out of range");
  at::Tensor out = at::empty({R}, logits.options().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) op[r] = draw_row(x + r * V, V, it[r], up[r]);
  });
  return out;
}

// The index of a row's largest value, torch.argmax's: the first of equal maxima, the first NaN where there
// is one (a NaN is larger than everything to argmax). LANES running maxima in strided lanes, compared
// strictly, so each lane keeps its first maximum; the lanes' best value, then its lowest index, wins.
constexpr int64_t LANES = 16;

int64_t argmax_row(const float* row, int64_t V) {
  if (V < LANES) {
    int64_t at = 0;
    for (int64_t i = 1; i < V && !std::isnan(row[at]); ++i)
      if (std::isnan(row[i]) || row[i] > row[at]) at = i;
    return at;
  }
  float best[LANES];
  int32_t idx[LANES];
  int32_t nan[LANES];
  for (int64_t j = 0; j < LANES; ++j) {
    best[j] = row[j];
    idx[j] = static_cast<int32_t>(j);
    nan[j] = row[j] != row[j];
  }
  const int64_t full = V / LANES * LANES;
  for (int64_t i = LANES; i < full; i += LANES) {
#pragma omp simd
    for (int64_t j = 0; j < LANES; ++j) {
      const float v = row[i + j];
      const bool gt = v > best[j];
      best[j] = gt ? v : best[j];
      idx[j] = gt ? static_cast<int32_t>(i + j) : idx[j];
      nan[j] |= v != v;
    }
  }
  int32_t any_nan = 0;
  for (int64_t j = 0; j < LANES; ++j) any_nan |= nan[j];
  for (int64_t i = full; i < V; ++i) any_nan |= row[i] != row[i];
  if (any_nan) {
    for (int64_t i = 0; i < V; ++i)
      if (std::isnan(row[i])) return i;
  }
  int64_t at = idx[0];
  float mx = best[0];
  for (int64_t j = 1; j < LANES; ++j)
    if (best[j] > mx || (best[j] == mx && idx[j] < at)) mx = best[j], at = idx[j];
  for (int64_t i = full; i < V; ++i)  // the tail comes after every lane's index: only a larger value wins
    if (row[i] > mx) mx = row[i], at = i;
  return at;
}

// logits [R, V] fp32 (contiguous rows) -> [R] int64, each row's torch.argmax
at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous() && logits.is_cpu(),
              "argmax_rows: logits must be a contiguous fp32 [rows, vocab] on the CPU");
  const int64_t R = logits.size(0), V = logits.size(1);
  TORCH_CHECK(V > 0 && V <= std::numeric_limits<int32_t>::max(), "argmax_rows: a vocabulary of ", V, " tokens");
  const float* x = logits.data_ptr<float>();
  at::Tensor out = at::empty({R}, logits.options().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) op[r] = argmax_row(x + r * V, V);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(inferledger_cpu, m) {
  m.def("sample_rows(Tensor logits, Tensor inv_temperature, Tensor u) -> Tensor");
  m.impl("sample_rows", c10::DispatchKey::CPU, TORCH_FN(sample_rows));
  m.def("argmax_rows(Tensor logits) -> Tensor");
  m.impl("argmax_rows", c10::DispatchKey::CPU, TORCH_FN(argmax_rows));
}
