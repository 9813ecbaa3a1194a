// Note [CPU levels]: the CPU library holds its kernels compiled for several x86-64
// levels (baseline SSE2, AVX2 + FMA + F16C, AVX-512 F/BW/VL/DQ) and registers, when it
// is loaded, the highest one this CPU runs (or CORE_OPS_CPU_LEVEL, if lower). The build
// (core_ops/native/build.py, MACHINE_LEVELS) compiles every source once per level with
// that level's flags and -DCORE_OPS_CPU_LEVEL=<name> -DCORE_OPS_CPU_LEVEL_ID=<0|1|2>;
// the wheel holds all three, a JIT build only the level of the machine that builds it.
// aarch64 has one level, neon (id 0): NEON is part of ARMv8-A, so every aarch64 CPU
// runs it (Note [Vector levels] in vec.h).
//
// Two rules keep a level's instructions off a CPU that lacks them:
//   - every kernel file's code sits in CORE_OPS_CPU_BEGIN / CORE_OPS_CPU_END, an
//     inline namespace named after the level, so each level's functions and template
//     instantiations are symbols of their own, never merged with another level's;
//   - code outside it that more than one level compiles (torch's and the standard
//     library's inline functions) is merged by the linker, which keeps the first copy:
//     the build links the baseline objects first (tests/test_cpu_levels.py reads the
//     library's disassembly to hold both rules).
#pragma once

#include <torch/csrc/stable/library.h>

#ifndef CORE_OPS_CPU_LEVEL
#define CORE_OPS_CPU_LEVEL baseline
#define CORE_OPS_CPU_LEVEL_ID 0
#endif

#define CORE_OPS_CPU_BEGIN \
  namespace core_ops::cpu { \
  inline namespace CORE_OPS_CPU_LEVEL {
#define CORE_OPS_CPU_END \
  }                      \
  }

namespace core_ops::cpu_levels {

using Registration = void (*)(torch::stable::detail::StableLibrary&);

// Called by each level's kernel files while the library loads (cpu/register.cpp).
void add(int level, Registration f);

struct Registrar {
  Registrar(int level, Registration f) { add(level, f); }
};

}  // namespace core_ops::cpu_levels

#define CORE_OPS_CPU_CONCAT_(a, b) a##b
#define CORE_OPS_CPU_CONCAT(a, b) CORE_OPS_CPU_CONCAT_(a, b)

// A kernel file's registrations, in place of STABLE_TORCH_LIBRARY_IMPL(core_ops, CPU, m),
// at the end of the file, the names of core_ops::cpu in scope:
//   CORE_OPS_CPU_KERNELS(m) { m.impl("multi_tensor_scale_", TORCH_BOX(&multi_tensor_scale_)); }
// The registrar runs before cpu/register.cpp's STABLE_TORCH_LIBRARY_IMPL (a lower
// init_priority), which then registers the functions of the level it chose.
#define CORE_OPS_CPU_KERNELS(m) CORE_OPS_CPU_KERNELS_(m, __COUNTER__)
#define CORE_OPS_CPU_KERNELS_(m, id)                                                        \
  using namespace ::core_ops::cpu;                                                          \
  static void CORE_OPS_CPU_CONCAT(core_ops_cpu_register_, id)(torch::stable::detail::StableLibrary&); \
  __attribute__((init_priority(200))) static const ::core_ops::cpu_levels::Registrar         \
      CORE_OPS_CPU_CONCAT(core_ops_cpu_registrar_, id)(CORE_OPS_CPU_LEVEL_ID,                \
                                                       &CORE_OPS_CPU_CONCAT(core_ops_cpu_register_, id)); \
  static void CORE_OPS_CPU_CONCAT(core_ops_cpu_register_, id)(torch::stable::detail::StableLibrary & m)

// A fused optimizer op's CPU kernel: its entry point (core_ops/optimizer_ops.h, generated
// from its declaration) running this level's step function.
#define CORE_OPS_CPU_OPTIMIZER(op, step) \
  CORE_OPS_CPU_KERNELS(m) { m.impl(#op, TORCH_BOX(&::core_ops::op<step>)); }
