// CPU kernel of multi_tensor_check_finite_: the non-finite probe of
// core_ops/multi_tensor_math.h over every element, read-only (Note [Read streams]).
#include <torch/library.h>

#include "chunk_loops.h"

namespace core_ops::cpu {
namespace {

void multi_tensor_check_finite_(at::TensorList tensors, const at::Tensor& found_inf) {
  if (!check_check_finite_args(tensors, found_inf)) return;

  ContiguousList ts(tensors, false);
  const auto chunks = make_chunks(tensors);
  std::atomic<bool> bad{false};
  const auto identity = [](auto v) { return v; };
  if (is_double_list(tensors)) {
    parallel_chunks(chunks, [&](const Chunk& c) {
      if (bad) return;  // the answer is known: the other chunks need not be read
      ChunkStats<double> st;
      const double* p = ts.tensors[c.tensor].data_ptr<double>();
      map_scalar<false, true, false>(p, static_cast<double*>(nullptr), c.begin, c.end, identity, st);
      if (st.nonfinite()) bad = true;
    });
  } else {
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(tensors[0].scalar_type(), "tensors", scalar_t,
      parallel_chunks(chunks, [&](const Chunk& c) {
        if (bad) return;
        const scalar_t* p = ts.tensors[c.tensor].data_ptr<scalar_t>() + c.begin;
        const auto st = map_chunk<false, true, false>(p, static_cast<scalar_t*>(nullptr),
                                                      c.end - c.begin, identity);
        if (st.nonfinite()) bad = true;
      }));
  }
  if (bad) set_flag(found_inf);
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("multi_tensor_check_finite_", &multi_tensor_check_finite_);
}

}  // namespace core_ops::cpu
