// CPU kernels of multi_tensor_scale_ and multi_tensor_axpby_.
#include <torch/library.h>

#include "chunk_loops.h"

namespace core_ops::cpu {
namespace {

void multi_tensor_scale_(at::TensorList src, at::TensorList dst, const at::Tensor& scale,
                         const at::Tensor& found_inf) {
  check_same_length(src, "src", dst, "dst");
  if (src.empty()) return;
  const auto device = src[0].device();
  check_list(src, "src", device);
  check_list(dst, "dst", device);
  check_same_numel(src, "src", dst, "dst");
  check_flag(found_inf, device);
  const double s = read_scalar(scale, "scale");

  ContiguousList in(src, false), out(dst, true);
  const auto chunks = make_chunks(src);
  std::atomic<bool> bad{false};

  if (is_double_list(src) || is_double_list(dst)) {
    TORCH_CHECK_TYPE(is_double_list(src) && is_double_list(dst),
                     "src and dst: float64 lists cannot be mixed with other dtypes");
    parallel_chunks(chunks, [&](const Chunk& c) {
      ChunkStats<double> st;
      map_scalar<true, true, false>(in.tensors[c.tensor].data_ptr<double>(),
                                    out.tensors[c.tensor].data_ptr<double>(), c.begin, c.end,
                                    [s](double v) { return scale_math(v, s); }, st);
      if (st.nonfinite()) bad = true;
    });
  } else {
    const float sf = static_cast<float>(s);
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(src[0].scalar_type(), "src", in_t,
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dst[0].scalar_type(), "dst", out_t,
        parallel_chunks(chunks, [&](const Chunk& c) {
          const auto st = map_chunk<true, true, false>(
              in.tensors[c.tensor].data_ptr<in_t>() + c.begin,
              out.tensors[c.tensor].data_ptr<out_t>() + c.begin, c.end - c.begin,
              [sf](auto v) { return scale_math(v, decltype(v)(sf)); });
          if (st.nonfinite()) bad = true;
        })));
  }
  if (bad) set_flag(found_inf);
  out.finish();
}

void multi_tensor_axpby_(at::TensorList x, at::TensorList y, at::TensorList out_list,
                         double a, double b, const at::Tensor& found_inf,
                         int64_t arg_to_check) {
  check_same_length(x, "x", y, "y");
  check_same_length(x, "x", out_list, "out");
  TORCH_CHECK_VALUE(arg_to_check >= -1 && arg_to_check <= 1,
                    "arg_to_check must be -1 (both), 0 (x) or 1 (y), got ", arg_to_check);
  if (x.empty()) return;
  const auto device = x[0].device();
  check_list(x, "x", device);
  check_list(y, "y", device);
  check_list(out_list, "out", device);
  check_same_numel(x, "x", y, "y");
  check_same_numel(x, "x", out_list, "out");
  check_flag(found_inf, device);

  ContiguousList xs(x, false), ys(y, false), outs(out_list, true);
  const auto chunks = make_chunks(x);
  std::atomic<bool> x_bad{false}, y_bad{false};

  if (is_double_list(x) || is_double_list(y) || is_double_list(out_list)) {
    TORCH_CHECK_TYPE(is_double_list(x) && is_double_list(y) && is_double_list(out_list),
                     "x, y and out: float64 lists cannot be mixed with other dtypes");
    parallel_chunks(chunks, [&](const Chunk& c) {
      double px = 0, py = 0;
      axpby_scalar<double>(xs.tensors[c.tensor].data_ptr<double>(),
                           ys.tensors[c.tensor].data_ptr<double>(),
                           outs.tensors[c.tensor].data_ptr<double>(), c.begin, c.end, a, b, px, py);
      if (!(px == px)) x_bad = true;
      if (!(py == py)) y_bad = true;
    });
  } else {
    const float af = static_cast<float>(a), bf = static_cast<float>(b);
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(x[0].scalar_type(), "x", x_t,
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(y[0].scalar_type(), "y", y_t,
        CORE_OPS_DISPATCH_FLOAT_HALF_BF16(out_list[0].scalar_type(), "out", out_t,
          parallel_chunks(chunks, [&](const Chunk& c) {
            const auto st = axpby_chunk(xs.tensors[c.tensor].data_ptr<x_t>() + c.begin,
                                        ys.tensors[c.tensor].data_ptr<y_t>() + c.begin,
                                        outs.tensors[c.tensor].data_ptr<out_t>() + c.begin,
                                        c.end - c.begin, af, bf);
            if (st.x_nonfinite) x_bad = true;
            if (st.y_nonfinite) y_bad = true;
          }))));
  }
  if ((arg_to_check != 1 && x_bad) || (arg_to_check != 0 && y_bad)) set_flag(found_inf);
  outs.finish();
}

}  // namespace

TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  m.impl("multi_tensor_scale_", &multi_tensor_scale_);
  m.impl("multi_tensor_axpby_", &multi_tensor_axpby_);
}

}  // namespace core_ops::cpu
