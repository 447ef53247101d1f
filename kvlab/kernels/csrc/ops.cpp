/* The library's one registration: the namespace `kvlab`, its operators' schemas and their CPU
   implementations (ops.h), so that a compiled graph calls them through the dispatcher with no Python
   between (torch.ops.kvlab.*; their shapes for the compiler are kvlab/kernels/ops.py's). */
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(kvlab, m) {
  m.def("paged_attention(Tensor q, Tensor keys, Tensor values, Tensor positions, Tensor pair_rows, "
        "Tensor pair_blocks) -> Tensor");
  m.def("linear(Tensor x, Tensor weight, Tensor panels) -> Tensor");
  m.def("linear_panels(Tensor weight) -> Tensor");
  m.def("panel_width() -> int", &kvlab::panel_width);  /* no tensor to dispatch on: one kernel for all */
  m.def("greedy_pick(Tensor logits, Tensor temperatures) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvlab, CPU, m) {
  m.impl("paged_attention", &kvlab::paged_attention);
  m.impl("linear", &kvlab::linear);
  m.impl("linear_panels", &kvlab::linear_panels);
  m.impl("greedy_pick", &kvlab::greedy_pick);
}
