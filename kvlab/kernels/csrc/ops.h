/* The operators of the library `kvlab`, as ops.cpp registers them (torch.ops.kvlab.*): each defined in
   its own file. */
#pragma once

#include <ATen/core/Tensor.h>

namespace kvlab {

/* paged_attention.cpp: block_attention's result, (N, 1, H * D), float32 */
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& positions, const at::Tensor& pair_rows, const at::Tensor& pair_blocks);

/* linear.cpp: x @ weight.T, as F.linear, on the weight's panels (linear_panels' copy of it) from 4 rows on */
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& panels);
/* linear.cpp: the weight (N, K) laid out in panels for `linear`, flat, float32; empty where it has none */
at::Tensor linear_panels(const at::Tensor& weight);
/* linear.cpp: the columns of one panel (32 with AVX-512, 16 with AVX2), 0 where `linear` has no panels */
int64_t panel_width();

/* greedy_pick.cpp: each row's argmax(logits / its temperature), (R,) int64 */
at::Tensor greedy_pick(const at::Tensor& logits, const at::Tensor& temperatures);

}  // namespace kvlab
