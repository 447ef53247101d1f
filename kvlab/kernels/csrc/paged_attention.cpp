/* The compiled step's paged attention on a CPU (torch.ops.kvlab.paged_attention): for each row, its
   query heads against the positions 0 .. its position, read block by block through its pairs, in one
   pass over the keys and one over the values.

   kvlab.serving.paged_attention.block_attention says the same in torch: inductor turns it into loops
   that score a (row, block) pair a position at a time, compute every score twice (once for the row's
   largest, once for the weights) and read whole blocks, masked. Here a row's scores are computed once
   into a scratch line, a query head's softmax runs over that line (float32, its largest subtracted, as
   MiniMind's), and the values are summed with the weights; K/V head h serves query heads h*G .. h*G+G-1
   (repeat_kv without the copy). The exponential is a polynomial (Cephes' expf; within 1.02 ulp of the
   exact value over [-87, 0], measured), written on eight lanes with the compiler's vector types
   (vec.h), as are the products: eight positions' products summed at once. For the lab's model's heads
   (dim 32, 2 K/V heads of 2 queries) and MiniMind's (dim 64 or 128) every head of a row is served in
   one pass over its blocks, the loops unrolled, and the next row's blocks are asked for
   (`__builtin_prefetch`, into the L2 cache) while a row works: a step's rows read blocks scattered
   through the pool, so memory sets the pace. Any other shape takes a plain loop a head at a time. A
   row reads no slot past its position.

   Measured on this project's machine (1 thread, 64 rows of 30 to 300 positions, the lab's model's
   heads, blocks scattered through the pool, the weights' products' traffic between layers): 0.39-0.43
   ms a layer, against 0.98 ms without asking for the next blocks ahead and 0.9-1.0 ms for
   `block_attention` compiled (docs/serving.md, "Then: a C++ attention"). Through the dispatcher (ops.cpp)
   a call costs 2.5 µs; 17 µs when it was a `torch.library.custom_op` calling the kernel through
   ctypes. Float32 on a CPU, head dims up to 256 only: elsewhere the step keeps `block_attention`. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <vector>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "ops.h"
#include "vec.h"

/* (sum of p[0], ..., sum of p[7]): each vector's lanes added, eight at once */
static inline v8f sums8(const v8f* p) {
  v8f pair[4];
  for (int i = 0; i < 4; ++i)
    pair[i] = __builtin_shufflevector(p[2 * i], p[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14)
              + __builtin_shufflevector(p[2 * i], p[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
  const v8f low = __builtin_shufflevector(pair[0], pair[1], 0, 1, 8, 9, 4, 5, 12, 13)
                  + __builtin_shufflevector(pair[0], pair[1], 2, 3, 10, 11, 6, 7, 14, 15);
  const v8f high = __builtin_shufflevector(pair[2], pair[3], 0, 1, 8, 9, 4, 5, 12, 13)
                   + __builtin_shufflevector(pair[2], pair[3], 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(low, high, 0, 1, 2, 3, 8, 9, 10, 11)
         + __builtin_shufflevector(low, high, 4, 5, 6, 7, 12, 13, 14, 15);
}

/* e^x on eight lanes, for x <= 0 (Cephes expf): x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-6
   polynomial, 2^n put in the exponent bits; below -87 (past float's range), 0 */
static inline v8f exp8(v8f x) {
  const v8f low = x < -87.0f ? (v8f){} + 1.0f : (v8f){};
  x = x < -87.0f ? (v8f){} - 87.0f : x;
  const v8f y = x * 1.44269504088896341f + 0.5f;
  v8i n = __builtin_convertvector(y, v8i);
  n += (v8i)(y < __builtin_convertvector(n, v8f));  /* truncation rounded a negative y up: one less */
  const v8f fn = __builtin_convertvector(n, v8f);
  const v8f r = (x - fn * 0.693359375f) + fn * 2.12194440e-4f;
  v8f p = (v8f){} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  v8i bits = (n + 127) << 23;
  v8f two;
  memcpy(&two, &bits, sizeof two);
  return low > 0.0f ? (v8f){} : p * two;
}

/* The same on one value (a line's last few positions). */
static inline float exp_le0(float x) { return exp8((v8f){} + x)[0]; }

/* A row's scores (scratch, G lines of `length`) turned into weights in place (each line's largest
   subtracted, then exponentiated); each line's sum into totals. */
static inline void softmax_lines(float* __restrict__ scratch, int64_t length, int64_t group, float* totals) {
  for (int64_t g = 0; g < group; ++g) {
    float* __restrict__ s = scratch + g * length;
    v8f tops = (v8f){} + s[0];
    int64_t i = 0;
    for (; i + 8 <= length; i += 8) {
      const v8f x = load8(s + i);
      tops = x > tops ? x : tops;
    }
    float top = s[0];
    for (int l = 0; l < 8; ++l) top = tops[l] > top ? tops[l] : top;
    for (; i < length; ++i) top = s[i] > top ? s[i] : top;
    v8f total = {};
    i = 0;
    for (; i + 8 <= length; i += 8) {
      const v8f e = exp8(load8(s + i) - top);
      store8(s + i, e);
      total += e;
    }
    float rest = 0.0f;
    for (; i < length; ++i) {
      s[i] = exp_le0(s[i] - top);
      rest += s[i];
    }
    totals[g] = sum8(total) + rest;
  }
}

/* Ask for the n positions' lines of a block (every head: a block's positions are contiguous). */
static inline void prefetch_block(const float* base, int64_t n, int64_t stride) {
  for (int64_t i = 0; i < n * stride; i += 16) __builtin_prefetch(base + i, 0, 3);
}

/* Ask, into the L2 cache, for a whole block's keys and values (the next row's). */
static inline void prefetch_ahead(const float* keys, const float* values, int64_t block, int64_t size) {
  for (int64_t i = 0; i < size; i += 16) {
    __builtin_prefetch(keys + block * size + i, 0, 1);
    __builtin_prefetch(values + block * size + i, 0, 1);
  }
}

/* One row, every head at once (head dim D, G query heads a K/V head, KV K/V heads): a pass over its
   blocks for the scores, each block's positions read whole (all K/V heads side by side), then the
   softmax of each query head's line, then a pass for the values. The blocks lie anywhere in the
   pool: the next block's keys and this block's values are asked for while this block is computed, unless
   the previous row read the same blocks (`read_before`: a prompt's rows, whose blocks are cached by now). */
template <int D, int G, int KV>
static void attend_row(const float* __restrict__ q, const float* __restrict__ keys,
                       const float* __restrict__ values, const int64_t* __restrict__ blocks, int64_t length,
                       int64_t bs, float root, float* __restrict__ scratch, float* __restrict__ out,
                       const int64_t* next_blocks, int64_t next_count, bool read_before) {
  constexpr int L = D / 8, H = KV * G;
  constexpr int64_t stride = KV * D;
  int64_t t = 0, b = 0;
  for (; t < length; ++b) {
    const float* __restrict__ block = keys + blocks[b] * bs * stride;
    const int64_t n = length - t < bs ? length - t : bs;
    if (!read_before) {
      if (t + n < length) prefetch_block(keys + blocks[b + 1] * bs * stride, bs, stride);
      prefetch_block(values + blocks[b] * bs * stride, n, stride);
    }
    if (b < next_count) prefetch_ahead(keys, values, next_blocks[b], bs * stride);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8, t += 8) {  /* eight positions' products, summed lane-wise in one go */
      for (int h = 0; h < KV; ++h) {
        v8f p[G][8];
        for (int i = 0; i < 8; ++i) {
          const float* __restrict__ k = block + (j + i) * stride + h * D;
          v8f kv[L];
          for (int l = 0; l < L; ++l) kv[l] = load8(k + l * 8);
          for (int g = 0; g < G; ++g) {
            const float* qg = q + (h * G + g) * D;
            p[g][i] = load8(qg) * kv[0];
            for (int l = 1; l < L; ++l) p[g][i] += load8(qg + l * 8) * kv[l];
          }
        }
        for (int g = 0; g < G; ++g) store8(scratch + (h * G + g) * length + t, sums8(p[g]) / root);
      }
    }
    for (; j < n; ++j, ++t) {
      for (int h = 0; h < KV; ++h) {
        const float* __restrict__ k = block + j * stride + h * D;
        for (int g = 0; g < G; ++g) {
          const float* qg = q + (h * G + g) * D;
          v8f p = load8(qg) * load8(k);
          for (int l = 1; l < L; ++l) p += load8(qg + l * 8) * load8(k + l * 8);
          scratch[(h * G + g) * length + t] = sum8(p) / root;
        }
      }
    }
  }
  for (; b < next_count; ++b) prefetch_ahead(keys, values, next_blocks[b], bs * stride);
  float totals[H];
  softmax_lines(scratch, length, H, totals);
  v8f acc[H][L] = {};
  t = 0;
  for (int64_t b = 0; t < length; ++b) {
    const float* __restrict__ block = values + blocks[b] * bs * stride;
    const int64_t n = length - t < bs ? length - t : bs;
    for (int64_t j = 0; j < n; ++j, ++t) {
      const float* __restrict__ v = block + j * stride;
      for (int h = 0; h < KV; ++h)
        for (int l = 0; l < L; ++l) {
          const v8f vl = load8(v + h * D + l * 8);
          for (int g = 0; g < G; ++g) acc[h * G + g][l] += scratch[(h * G + g) * length + t] * vl;
        }
    }
  }
  for (int e = 0; e < H; ++e)
    for (int l = 0; l < L; ++l) store8(out + e * D + l * 8, acc[e][l] * (1.0f / totals[e]));
}

/* Any other shape: one row's query heads h*G .. h*G+G-1 against its positions 0 .. length-1 through
   K/V head h (D at most 256). */
static void attend(const float* __restrict__ q, const float* __restrict__ keys, const float* __restrict__ values,
                   const int64_t* __restrict__ blocks, int64_t length, int64_t bs, int64_t stride, float root,
                   float* __restrict__ scratch, float* __restrict__ out, int64_t D, int64_t G) {
  int64_t t = 0;
  for (int64_t b = 0; t < length; ++b) {
    const float* __restrict__ block = keys + blocks[b] * bs * stride;
    const int64_t n = length - t < bs ? length - t : bs;
    for (int64_t j = 0; j < n; ++j, ++t) {
      const float* __restrict__ k = block + j * stride;
      for (int64_t g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d) dot += q[g * D + d] * k[d];
        scratch[g * length + t] = dot / root;
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    const float* __restrict__ s = scratch + g * length;
    float total;
    softmax_lines(scratch + g * length, length, 1, &total);
    float acc[256] = {0.0f};
    t = 0;
    for (int64_t b = 0; t < length; ++b) {
      const float* __restrict__ block = values + blocks[b] * bs * stride;
      const int64_t n = length - t < bs ? length - t : bs;
      for (int64_t j = 0; j < n; ++j, ++t) {
        const float w = s[t];
        const float* __restrict__ v = block + j * stride;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc[d] += w * v[d];
      }
    }
    const float inverse = 1.0f / total;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) out[g * D + d] = acc[d] * inverse;
  }
}

/* q (N, H, D); keys, values (blocks, bs, KV, D); positions (N,); pairs (P,) grouped by row in block
   order; out (N, H, D). D at most 256. A row reads no slot past its position. */
extern "C" void kvlab_paged_attention(const float* q, const float* keys, const float* values,
                                      const int64_t* positions, const int64_t* pair_rows,
                                      const int64_t* pair_blocks, int64_t N, int64_t P, int64_t H,
                                      int64_t KV, int64_t D, int64_t bs, float root, float* out) {
  static thread_local std::vector<float> lines;  /* a row's scores, G lines of its length */
  const int64_t G = H / KV, stride = KV * D;
  int64_t first = 0, last = 0;  /* this row's pairs: first .. last - 1 */
  int64_t previous_first = -1;  /* the first block the previous row read */
  while (last < P && pair_rows[last] == 0) ++last;
  for (int64_t row = 0; row < N; ++row) {
    const int64_t length = positions[row] + 1;
    if ((int64_t)lines.size() < H * length) lines.resize(H * length * 2);
    float* scratch = lines.data();
    const int64_t* blocks = pair_blocks + first;
    int64_t next_end = last;  /* the next row's pairs, whose blocks are asked for while this row works */
    while (next_end < P && pair_rows[next_end] == row + 1) ++next_end;
    const int64_t* next_blocks = pair_blocks + last;
    /* a prompt's next row reads the same blocks, cached by now: nothing to ask for */
    const int64_t next_count = next_end > last && next_blocks[0] != blocks[0] ? next_end - last : 0;
    const bool read_before = blocks[0] == previous_first;  /* the previous row's blocks (a prompt's) */
    previous_first = blocks[0];
    const float* qr = q + row * H * D;
    float* orow = out + row * H * D;
    if (D == 32 && G == 2 && KV == 2)  /* the lab's model */
      attend_row<32, 2, 2>(qr, keys, values, blocks, length, bs, root, scratch, orow, next_blocks,
                              next_count, read_before);
    else if (D == 64 && G == 4 && KV == 2)  /* MiniMind2's 512 and 768 wide models */
      attend_row<64, 4, 2>(qr, keys, values, blocks, length, bs, root, scratch, orow, next_blocks,
                              next_count, read_before);
    else if (D == 64 && G == 2 && KV == 4)
      attend_row<64, 2, 4>(qr, keys, values, blocks, length, bs, root, scratch, orow, next_blocks,
                              next_count, read_before);
    else if (D == 128 && G == 4 && KV == 2)
      attend_row<128, 4, 2>(qr, keys, values, blocks, length, bs, root, scratch, orow, next_blocks,
                              next_count, read_before);
    else
      for (int64_t h = 0; h < KV; ++h)
        attend(qr + h * G * D, keys + h * D, values + h * D, blocks, length, bs, stride, root, scratch,
               orow + h * G * D, D, G);
    first = last;
    last = next_end;
  }
}

/* The operator torch.ops.kvlab.paged_attention: block_attention's result, (N, 1, H * D), from the same
   inputs (pair_starts implied: a row's pairs are its table's blocks in order). */
at::Tensor kvlab::paged_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                  const at::Tensor& positions, const at::Tensor& pair_rows,
                                  const at::Tensor& pair_blocks) {
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.sizes() == keys.sizes(),
              "kvlab::paged_attention: q (N, 1, H, D), keys and values (blocks, bs, KV, D)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat &&
              values.scalar_type() == at::kFloat, "kvlab::paged_attention: float32 only");
  TORCH_CHECK(q.size(3) == keys.size(3) && q.size(3) <= 256 && q.size(2) % keys.size(2) == 0,
              "kvlab::paged_attention: head dims differ, exceed 256, or H is not a multiple of KV");
  const at::Tensor qc = q.contiguous(), kc = keys.contiguous(), vc = values.contiguous();
  const at::Tensor at_ = positions.to(at::kLong).contiguous(), rows = pair_rows.to(at::kLong).contiguous(),
                   blocks = pair_blocks.to(at::kLong).contiguous();
  const int64_t N = qc.size(0), H = qc.size(2), D = qc.size(3);
  at::Tensor out = at::empty({N, 1, H * D}, qc.options());
  kvlab_paged_attention(qc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(), at_.data_ptr<int64_t>(),
                        rows.data_ptr<int64_t>(), blocks.data_ptr<int64_t>(), N, rows.size(0), H, kc.size(2), D,
                        kc.size(1), sqrtf((float)D), out.data_ptr<float>());
  return out;
}
