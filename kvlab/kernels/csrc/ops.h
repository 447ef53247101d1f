/* The operators of the library `kvlab`, as ops.cpp registers them (torch.ops.kvlab.*): each defined in
   its own file. */
#pragma once

#include <ATen/core/Tensor.h>

namespace kvlab {

/* paged_attention.cpp: block_attention's result, (N, 1, H * D), float32 */
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                           const at::Tensor& positions, const at::Tensor& pair_rows, const at::Tensor& pair_blocks);

/* linear.cpp: x @ weight.T, as F.linear */
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& pack_id);

/* greedy_pick.cpp: each row's argmax(logits / its temperature), (R,) int64 */
at::Tensor greedy_pick(const at::Tensor& logits, const at::Tensor& temperatures);

}  // namespace kvlab
