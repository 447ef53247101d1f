"""The compiled step's products with its packed weights, as a C++ operator built into
kvlab.serving.cpu_attention's library (one build, one load, the namespace `kvlab`).

`kvlab.linear(x, weight, pack_id)` is F.linear for the step's products with its packed weights: from
4 rows on, oneDNN's product (`mkldnn::_linear_pointwise`) on oneDNN's own packed copy of the weight
(`mkldnn::_reorder_linear_weight`), made at a weight's first use and kept by the packed weights'
`pack_id` (kvlab.engine.step.PackedWeights: a number no other copy into packed weights had in this
process, so changed weights are packed again; the copies of the last four pack_ids are kept). Measured
alone on this project's machine: 8-13% faster than MKL's at 500 rows; at 37-64 rows from 7% slower
(q/k/v) to 18% faster (the LM head); MKL's very bits where the inner size is 128. In the engine's run
of 64 requests, 6% shorter (one process, alternating), the same tokens.
Below 4 rows, where oneDNN's bits differ and it is no faster, MKL's product, as before. Its packed
weight is an opaque tensor, which inductor cannot take as an input; through this operator it never
enters the graph.
"""

SOURCE = r"""
#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/matmul.h>
#include <torch/library.h>

/* The operator torch.ops.kvlab.linear: x @ weight.T, as F.linear, for the compiled step's products
   with the packed weights (views of one buffer, whose contents `pack_id` names: a number no other copy
   into packed weights had in this process). From 4 rows on, oneDNN's product on its own packed copy of
   the weight (`mkldnn::_reorder_linear_weight`, made once per weight and pack_id, kept here); below,
   where oneDNN's bits differ from MKL's, MKL's product as before. Alone, with the weights out of
   cache, oneDNN's call costs some 10-15 us more, so small products lose (q/k/v and o at 37 rows) and
   wide ones win (the LM head from 4 rows, gate/up from some 48); in the engine's run oneDNN from 4 rows
   on for every product measured 2-3% faster than only where it wins alone (one process, alternating). */
static const int64_t MIN_ROWS = 4;

struct PackedWeight {
  int64_t rows, cols;
  at::Tensor packed;
};

static const size_t KEPT_PACKS = 4;  /* the packed weights whose copies are kept: the last used */

static at::Tensor linear_op(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& pack_id) {
  const int64_t K = weight.size(1), N = weight.size(0), M = K ? x.numel() / K : 0;
  if (M < MIN_ROWS || x.scalar_type() != at::kFloat || weight.scalar_type() != at::kFloat || !x.is_cpu())
    return at::matmul(x, weight.t());
  static std::mutex lock;
  /* by pack_id, then by where the weight lies; `recent`: the pack_ids kept, the last used last */
  static std::unordered_map<int64_t, std::unordered_map<const void*, PackedWeight>> kept;
  static std::vector<int64_t> recent;
  static auto reorder = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
      .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
  static auto product = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "")
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                        c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
  const int64_t id = *pack_id.data_ptr<int64_t>();
  at::Tensor packed;
  {
    std::lock_guard<std::mutex> guard(lock);
    if (recent.empty() || recent.back() != id) {
      auto at_ = std::find(recent.begin(), recent.end(), id);
      if (at_ != recent.end()) {
        recent.erase(at_);
      } else if (recent.size() == KEPT_PACKS) {  /* the least recently used packed weights' copies go */
        kept.erase(recent.front());
        recent.erase(recent.begin());
      }
      recent.push_back(id);
    }
    PackedWeight& slot = kept[id][weight.data_ptr()];
    if (!slot.packed.defined() || slot.rows != N || slot.cols != K) {
      slot.packed = reorder.call(weight.contiguous(), 64);
      slot.rows = N;
      slot.cols = K;
    }
    packed = slot.packed;
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  return product.call(x.reshape({M, K}).contiguous(), packed, std::nullopt, "none",
                      c10::List<std::optional<at::Scalar>>(), std::nullopt).view(shape);
}

TORCH_LIBRARY_FRAGMENT(kvlab, m) { m.def("linear(Tensor x, Tensor weight, Tensor pack_id) -> Tensor"); }

TORCH_LIBRARY_IMPL(kvlab, CPU, m) { m.impl("linear", &linear_op); }
"""


def traced_shape(x, weight, pack_id):
    """kvlab::linear's result as the compiler traces it: x's shape, its last size the weight's rows."""
    return x.new_empty(*x.shape[:-1], weight.shape[0])
