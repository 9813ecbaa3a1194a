// CPU kernels of multi_tensor_scale_ and multi_tensor_axpby_.
#include <torch/csrc/stable/library.h>

#include "chunk_loops.h"
#include "level.h"

CORE_OPS_CPU_BEGIN
namespace {

void multi_tensor_scale_(TensorList src, TensorList dst, const Tensor& scale,
                         const Tensor& found_inf) {
  if (!check_scale_args(src, dst, scale, found_inf)) return;
  const double s = read_scalar(scale, "scale");

  ContiguousList in(src, false), out(dst, true);
  const auto chunks = make_chunks(src);
  std::atomic<bool> bad{false};

  if (all_or_no_double({src, dst}, "src and dst")) {
    parallel_chunks(chunks, [&](const Chunk& c) {
      ChunkStats<double> st;
      map_scalar<true, true, false>(in.data<double>(c.tensor),
                                    out.data<double>(c.tensor), c.begin, c.end,
                                    [s](double v) { return scale_math(v, s); }, st);
      if (st.nonfinite()) bad = true;
    });
  } else {
    const float sf = static_cast<float>(s);
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(src[0]), "src", in_t,
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(dst[0]), "dst", out_t,
        parallel_chunks(chunks, [&](const Chunk& c) {
          const auto st = map_chunk<true, true, false>(
              in.data<in_t>(c.tensor) + c.begin,
              out.data<out_t>(c.tensor) + c.begin, c.end - c.begin,
              [sf](auto v) { return scale_math(v, decltype(v)(sf)); });
          if (st.nonfinite()) bad = true;
        })));
  }
  if (bad) set_flag(found_inf);
  out.finish();
}

void multi_tensor_axpby_(TensorList x, TensorList y, TensorList out_list,
                         double a, double b, const Tensor& found_inf,
                         int64_t arg_to_check) {
  if (!check_axpby_args(x, y, out_list, found_inf, arg_to_check)) return;

  ContiguousList xs(x, false), ys(y, false), outs(out_list, true);
  const auto chunks = make_chunks(x);
  std::atomic<bool> x_bad{false}, y_bad{false};

  if (all_or_no_double({x, y, out_list}, "x, y and out")) {
    parallel_chunks(chunks, [&](const Chunk& c) {
      double px = 0, py = 0;
      axpby_scalar<double>(xs.data<double>(c.tensor),
                           ys.data<double>(c.tensor),
                           outs.data<double>(c.tensor), c.begin, c.end, a, b, px, py);
      if (!(px == px)) x_bad = true;
      if (!(py == py)) y_bad = true;
    });
  } else {
    const float af = static_cast<float>(a), bf = static_cast<float>(b);
    CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(x[0]), "x", x_t,
      CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(y[0]), "y", y_t,
        CORE_OPS_DISPATCH_FLOAT_HALF_BF16(dtype_of(out_list[0]), "out", out_t,
          parallel_chunks(chunks, [&](const Chunk& c) {
            const auto st = axpby_chunk(xs.data<x_t>(c.tensor) + c.begin,
                                        ys.data<y_t>(c.tensor) + c.begin,
                                        outs.data<out_t>(c.tensor) + c.begin,
                                        c.end - c.begin, af, bf);
            if (st.x_nonfinite) x_bad = true;
            if (st.y_nonfinite) y_bad = true;
          }))));
  }
  if ((arg_to_check != 1 && x_bad) || (arg_to_check != 0 && y_bad)) set_flag(found_inf);
  outs.finish();
}

}  // namespace
CORE_OPS_CPU_END

CORE_OPS_CPU_KERNELS(m) {
  m.impl("multi_tensor_scale_", TORCH_BOX(&multi_tensor_scale_));
  m.impl("multi_tensor_axpby_", TORCH_BOX(&multi_tensor_axpby_));
}
