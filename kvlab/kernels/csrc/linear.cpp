/* The compiled step's products with its packed weights on a CPU (torch.ops.kvlab.linear): F.linear,
   x @ weight.T. From 4 rows on, a product of its own: the weight copied once into panels of 32
   columns (16 with AVX2), each panel's 32 weights of one inner index side by side, and 8 rows of x at a
   time against a panel, 8 x 32 sums in vector registers, each output one chain of fused multiply-adds
   over the inner index in order; panel by panel, so each weight is read once a call whatever the rows.
   The copy is the caller's, an input like the weight (kvlab::linear_panels lays it out; the packed
   weights make it once per weight version, kvlab.engine.step.PackedWeights): the operator keeps
   nothing between calls. Below 4 rows, and where the CPU has neither AVX-512 nor AVX2 with FMA (no
   panels then: kvlab::panel_width is 0), MKL's product (at::matmul), as `generate` alone computes it.

   Why its own: the step's products are small (the lab's model: 128 inner, 128 to 1,884 outer, 4 to
   512 rows), and what a library call costs around them counts. Measured alone on this project's
   machine (1 thread, weights in cache): oneDNN's product (`mkldnn::_linear_pointwise` on its packed
   weight, what this operator called before) spent some 10 µs a call in its own bookkeeping (a
   primitive looked up, its arguments mapped, its scratchpad allocated), a tenth of the engine's run
   (perf, the 64-request benchmark); MKL's some 2-5 µs and slower kernels at these sizes. This one: 13
   µs for the o projection at 37 rows (oneDNN 25, MKL 16), 80 µs for gate/up (94, 105), 166 µs for the
   LM head (181, 220); at 500 rows within 3% of oneDNN's (at or above it for 128 and 256 outputs, 3-7%
   below for the widest). Its bits are MKL's and oneDNN's where the inner size is 128 (each sums a chain
   in order there), oneDNN's where it is 448 (MKL blocks it); checked against both at 4 to 500 rows. */
#include <stdint.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/zeros.h>

#include "ops.h"

/* From 4 rows on, the product below on the weight's panels; below, MKL's (at::matmul). */
static const int64_t MIN_ROWS = 4;

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define KVLAB_PANELS 1
/* A panel: NR columns of the weight, for k = 0 .. K-1 the NR weights of column k side by side (zero past
   the weight's last row). A tile: MR rows of x against one panel, MR x NR sums in registers, each
   output one chain of fused multiply-adds over k in order (as MKL's and oneDNN's kernels sum it at
   these sizes: the same bits where the inner size fits their block, 128 here). */
#if defined(__AVX512F__)
typedef __m512 vec;
static const int LANE = 16;
static inline vec vzero() { return _mm512_setzero_ps(); }
static inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
static inline vec vbroadcast(const float* p) { return _mm512_set1_ps(*p); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
#else
typedef __m256 vec;
static const int LANE = 8;
static inline vec vzero() { return _mm256_setzero_ps(); }
static inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
static inline vec vbroadcast(const float* p) { return _mm256_broadcast_ss(p); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
#endif
static const int64_t LANES = 2, NR = LANES * LANE, MR = 8;

template <int ROWS>
static inline void tile(const float* x, int64_t K, const float* panel, float* out, int64_t N, int64_t cols) {
  vec sum[ROWS][LANES];
  for (int i = 0; i < ROWS; ++i)
    for (int l = 0; l < LANES; ++l) sum[i][l] = vzero();
  for (int64_t k = 0; k < K; ++k) {
    vec w[LANES];
    for (int l = 0; l < LANES; ++l) w[l] = vload(panel + k * NR + l * LANE);
    for (int i = 0; i < ROWS; ++i) {
      vec a = vbroadcast(x + i * K + k);
      for (int l = 0; l < LANES; ++l) sum[i][l] = vfma(a, w[l], sum[i][l]);
    }
  }
  alignas(64) float line[NR];
  for (int i = 0; i < ROWS; ++i) {
    float* to = cols == NR ? out + i * N : line;
    for (int l = 0; l < LANES; ++l) vstore(to + l * LANE, sum[i][l]);
    if (cols != NR) memcpy(out + i * N, line, cols * sizeof(float));
  }
}

typedef void (*tile_fn)(const float*, int64_t, const float*, float*, int64_t, int64_t);
static const tile_fn TILES[MR + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>, tile<7>, tile<8>};

/* out (M, N) = x (M, K) times the panels' weight: panel by panel (each read once, from memory or cache,
   while every row passes it), MR rows at a time; panels shared among torch's threads. */
static void panel_product(const float* x, int64_t M, int64_t K, const float* panels, int64_t N, float* out) {
  const int64_t count = (N + NR - 1) / NR, grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, M * K * NR));
  at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t cols = std::min(NR, N - p * NR);
      for (int64_t m = 0; m < M; m += MR)
        TILES[std::min(MR, M - m)](x + m * K, K, panels + p * K * NR, out + m * N + p * NR, N, cols);
    }
  });
}

#else
#define KVLAB_PANELS 0
static const int64_t NR = 0;
#endif

int64_t kvlab::panel_width() { return NR; }

at::Tensor kvlab::linear_panels(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "kvlab::linear_panels: a weight (N, K), not ", weight.dim(), " dimensions");
#if !KVLAB_PANELS
  return at::empty({0}, weight.options().dtype(at::kFloat));
#else
  const int64_t N = weight.size(0), K = weight.size(1);
  at::Tensor panels = at::zeros({(N + NR - 1) / NR * K * NR}, weight.options().dtype(at::kFloat));
  const at::Tensor rows = weight.to(at::kFloat).contiguous();
  const float* from = rows.data_ptr<float>();
  float* to = panels.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) to[(n / NR) * K * NR + k * NR + n % NR] = from[n * K + k];
  return panels;
#endif
}

at::Tensor kvlab::linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& panels) {
  const int64_t K = weight.size(1), M = K ? x.numel() / K : 0;
  if (!KVLAB_PANELS || M < MIN_ROWS || x.scalar_type() != at::kFloat || weight.scalar_type() != at::kFloat ||
      !x.is_cpu() || panels.numel() == 0)
    return at::matmul(x, weight.t());
#if KVLAB_PANELS
  const int64_t N = weight.size(0);
  TORCH_CHECK(panels.numel() == (N + NR - 1) / NR * K * NR && panels.is_contiguous() &&
                  panels.scalar_type() == at::kFloat,
              "kvlab::linear: panels of ", panels.numel(), " floats for a weight (", N, ", ", K,
              "): not kvlab::linear_panels' layout of it");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  const at::Tensor rows = x.contiguous();
  at::Tensor out = at::empty(shape, x.options());
  panel_product(rows.data_ptr<float>(), M, K, panels.data_ptr<float>(), N, out.data_ptr<float>());
  return out;
#endif
}
