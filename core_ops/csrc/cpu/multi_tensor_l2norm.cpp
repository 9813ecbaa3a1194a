// CPU kernels of multi_tensor_l2norm and multi_tensor_unscale_l2norm_.
//
// Each chunk sums squares in float vectors (two accumulators, 16K elements a chunk),
// chunk sums are combined in double in a fixed order, so the result does not depend
// on the thread count.
#include <torch/csrc/stable/library.h>

#include "chunk_loops.h"
#include "level.h"

CORE_OPS_CPU_BEGIN
namespace {

// Turns per-chunk sums of squares into (total norm, per-tensor norms).
std::tuple<Tensor, Tensor> finish_norms(TensorList tensors, const std::vector<Chunk>& chunks,
                                        const std::vector<double>& sumsq, bool per_tensor, ScalarType dtype) {
  const int64_t n = static_cast<int64_t>(tensors.size());
  std::vector<double> per(n, 0.0);
  for (size_t i = 0; i < chunks.size(); ++i) per[chunks[i].tensor] += sumsq[i];
  double total = 0;
  for (double v : per) total += v;
  const Device cpu(DeviceType::CPU);
  Tensor total_t = core_ops::empty({}, dtype, cpu);
  Tensor per_t = core_ops::empty({per_tensor ? n : 0}, dtype, cpu);
  if (dtype == ScalarType::Double) {
    *data<double>(total_t) = std::sqrt(total);
    for (int64_t i = 0; per_tensor && i < n; ++i) data<double>(per_t)[i] = std::sqrt(per[i]);
  } else {
    *data<float>(total_t) = static_cast<float>(std::sqrt(total));
    for (int64_t i = 0; per_tensor && i < n; ++i)
      data<float>(per_t)[i] = static_cast<float>(std::sqrt(per[i]));
  }
  return {total_t, per_t};
}

// The shared body: f maps each element (identity for l2norm, times inv_scale for
// unscale); kWrite writes the mapped value back in place.
template <bool kWrite, bool kProbe>
std::tuple<Tensor, Tensor> norm_impl(TensorList tensors, double mul, bool per_tensor, bool* bad_out) {
  ContiguousList ts(tensors, kWrite);
  const auto chunks = make_chunks(tensors);
  std::vector<double> sumsq(chunks.size(), 0.0);
  std::atomic<bool> bad{false};
  const bool is_double = is_double_list(tensors);
  if (is_double) {
    parallel_chunks(chunks, [&](const Chunk& c) {
      ChunkStats<double> st;
      double* p = ts.data<double>(c.tensor);
      map_scalar<kWrite, kProbe, true>(p, p, c.begin, c.end,
                                       [mul](double v) { return scale_math(v, mul); }, st);
      sumsq[&c - chunks.data()] = st.sumsq;
      if (st.nonfinite()) bad = true;
    });
  } else {
    const float mf = static_cast<float>(mul);
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(tensors[0]), "tensors", scalar_t,
      parallel_chunks(chunks, [&](const Chunk& c) {
        scalar_t* p = ts.data<scalar_t>(c.tensor) + c.begin;
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
  return finish_norms(tensors, chunks, sumsq, per_tensor, is_double ? ScalarType::Double : ScalarType::Float);
}

void check_tensors(TensorList tensors) {
  CallDevice().list(tensors, "tensors");
  check_list(tensors, "tensors", tensors[0].device());
}

std::tuple<Tensor, Tensor> multi_tensor_l2norm(TensorList tensors, bool per_tensor) {
  if (tensors.empty()) {
    const Device cpu(DeviceType::CPU);
    return {core_ops::zeros({}, ScalarType::Float, cpu), core_ops::empty({0}, ScalarType::Float, cpu)};
  }
  check_tensors(tensors);
  return norm_impl<false, false>(tensors, 1.0, per_tensor, nullptr);
}

std::tuple<Tensor, Tensor> multi_tensor_unscale_l2norm_(
    TensorList tensors, const Tensor& inv_scale, const Tensor& found_inf,
    bool per_tensor) {
  if (!check_unscale_args(tensors, inv_scale, found_inf)) {
    const Device cpu(DeviceType::CPU);
    return {core_ops::zeros({}, ScalarType::Float, cpu), core_ops::empty({0}, ScalarType::Float, cpu)};
  }
  bool bad = false;
  auto result = norm_impl<true, true>(tensors, read_scalar(inv_scale, "inv_scale"), per_tensor, &bad);
  if (bad) set_flag(found_inf);
  return result;
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_KERNELS(m) {
  m.impl("multi_tensor_l2norm", TORCH_BOX(&multi_tensor_l2norm));
  m.impl("multi_tensor_unscale_l2norm_", TORCH_BOX(&multi_tensor_unscale_l2norm_));
}
