// CPU kernels of multi_tensor_l2norm and multi_tensor_unscale_l2norm_.
//
// Each chunk sums squares in float vectors (two accumulators, 16K elements a chunk),
// chunk sums are combined in double in a fixed order, so the result does not depend
// on the thread count.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "chunk_loops.h"

namespace core_ops::cpu {
namespace {

// Turns per-chunk sums of squares into (total norm, per-tensor norms).
std::tuple<at::Tensor, at::Tensor> finish_norms(at::TensorList tensors,
                                                const std::vector<Chunk>& chunks,
                                                const std::vector<double>& sumsq,
                                                bool per_tensor, at::ScalarType dtype) {
  const int64_t n = static_cast<int64_t>(tensors.size());
  std::vector<double> per(n, 0.0);
  for (size_t i = 0; i < chunks.size(); ++i) per[chunks[i].tensor] += sumsq[i];
  double total = 0;
  for (double v : per) total += v;
  auto opts = at::TensorOptions().dtype(dtype).device(at::kCPU);
  at::Tensor total_t = at::empty({}, opts);
  at::Tensor per_t = at::empty({per_tensor ? n : 0}, opts);
  if (dtype == at::kDouble) {
    *total_t.data_ptr<double>() = std::sqrt(total);
    for (int64_t i = 0; per_tensor && i < n; ++i) per_t.data_ptr<double>()[i] = std::sqrt(per[i]);
  } else {
    *total_t.data_ptr<float>() = static_cast<float>(std::sqrt(total));
    for (int64_t i = 0; per_tensor && i < n; ++i)
      per_t.data_ptr<float>()[i] = static_cast<float>(std::sqrt(per[i]));
  }
  return {total_t, per_t};
}

// The shared body: f maps each element (identity for l2norm, times inv_scale for
// unscale); kWrite writes the mapped value back in place.
template <bool kWrite, bool kProbe>
std::tuple<at::Tensor, at::Tensor> norm_impl(at::TensorList tensors, double mul,
                                             bool per_tensor, bool* bad_out) {
  ContiguousList ts(tensors, kWrite);
  const auto chunks = make_chunks(tensors);
  std::vector<double> sumsq(chunks.size(), 0.0);
  std::atomic<bool> bad{false};
  const bool is_double = is_double_list(tensors);
  if (is_double) {
    parallel_chunks(chunks, [&](const Chunk& c) {
      ChunkStats<double> st;
      double* p = ts.tensors[c.tensor].data_ptr<double>();
      map_scalar<kWrite, kProbe, true>(p, p, c.begin, c.end,
                                       [mul](double v) { return scale_math(v, mul); }, st);
      sumsq[&c - chunks.data()] = st.sumsq;
      if (st.nonfinite()) bad = true;
    });
  } else {
    const float mf = static_cast<float>(mul);
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(tensors[0].scalar_type(), "tensors", scalar_t,
      parallel_chunks(chunks, [&](const Chunk& c) {
        scalar_t* p = ts.tensors[c.tensor].data_ptr<scalar_t>() + c.begin;
        const auto st = map_chunk<kWrite, kProbe, true>(
            p, p, c.end - c.begin, [mf](auto v) {
              // l2norm reads only: skip the multiply by one.
              if constexpr (kWrite) return scale_math(v, decltype(v)(mf)); else return v;
            });
        sumsq[&c - chunks.data()] = st.sumsq;
        if (st.nonfinite()) bad = true;
      }));
  }
  ts.finish();
  if (bad_out) *bad_out = bad;
  return finish_norms(tensors, chunks, sumsq, per_tensor, is_double ? at::kDouble : at::kFloat);
}

void check_tensors(at::TensorList tensors) {
  check_list(tensors, "tensors", tensors[0].device());
}

std::tuple<at::Tensor, at::Tensor> multi_tensor_l2norm(at::TensorList tensors, bool per_tensor) {
  if (tensors.empty()) {
    auto opts = at::TensorOptions().dtype(at::kFloat);
    return {at::zeros({}, opts), at::empty({0}, opts)};
  }
  check_tensors(tensors);
  return norm_impl<false, false>(tensors, 1.0, per_tensor, nullptr);
}

std::tuple<at::Tensor, at::Tensor> multi_tensor_unscale_l2norm_(
    at::TensorList tensors, const at::Tensor& inv_scale, const at::Tensor& found_inf,
    bool per_tensor) {
  if (tensors.empty()) {
    auto opts = at::TensorOptions().dtype(at::kFloat);
    return {at::zeros({}, opts), at::empty({0}, opts)};
  }
  check_tensors(tensors);
  check_flag(found_inf, tensors[0].device());
  bool bad = false;
  auto result = norm_impl<true, true>(tensors, read_scalar(inv_scale, "inv_scale"), per_tensor, &bad);
  if (bad) set_flag(found_inf);
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("multi_tensor_l2norm", &multi_tensor_l2norm);
  m.impl("multi_tensor_unscale_l2norm_", &multi_tensor_unscale_l2norm_);
}

}  // namespace core_ops::cpu
