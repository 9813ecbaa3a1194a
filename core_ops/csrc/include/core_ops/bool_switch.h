// bool_switch(b, f): calls f(std::true_type{}) or f(std::false_type{}), so a runtime
// flag (AdamW vs L2, amsgrad, master weights) becomes a template parameter of the inner
// loop without writing the if/else at every call site. Shared by the CPU and CUDA
// launchers (host code only).
#pragma once

#include <type_traits>

namespace core_ops {

template <typename F>
void bool_switch(bool b, F&& f) {
  if (b) f(std::true_type{}); else f(std::false_type{});
}

}  // namespace core_ops
