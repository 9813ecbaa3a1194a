// CPU kernel of multi_tensor_check_finite_: the non-finite probe of
// core_ops/multi_tensor_math.h over every element, read-only (Note [Read streams]).
#include <torch/csrc/stable/library.h>

#include "chunk_loops.h"
#include "level.h"

CORE_OPS_CPU_BEGIN
namespace {

void multi_tensor_check_finite_(TensorList tensors, const Tensor& found_inf) {
  if (!check_check_finite_args(tensors, found_inf)) return;

  ContiguousList ts(tensors, false);
  const auto chunks = make_chunks(tensors);
  std::atomic<bool> bad{false};
  const auto identity = [](auto v) { return v; };
  if (is_double_list(tensors)) {
    parallel_chunks(chunks, [&](const Chunk& c) {
      if (bad) return;  // the answer is known: the other chunks need not be read
      ChunkStats<double> st;
      const double* p = ts.data<double>(c.tensor);
      map_scalar<false, true, false>(p, static_cast<double*>(nullptr), c.begin, c.end, identity, st);
      if (st.nonfinite()) bad = true;
    });
  } else {
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(tensors[0]), "tensors", scalar_t,
      parallel_chunks(chunks, [&](const Chunk& c) {
        if (bad) return;
        const scalar_t* p = ts.data<scalar_t>(c.tensor) + c.begin;
        const auto st = map_chunk<false, true, false>(p, static_cast<scalar_t*>(nullptr),
                                                      c.end - c.begin, identity);
        if (st.nonfinite()) bad = true;
      }));
  }
  if (bad) set_flag(found_inf);
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_KERNELS(m) {
  m.impl("multi_tensor_check_finite_", TORCH_BOX(&multi_tensor_check_finite_));
}
