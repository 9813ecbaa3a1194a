// The CPU library's one registration (Note [CPU levels] in level.h): the kernels of the
// highest level compiled in that this CPU runs and CORE_OPS_CPU_LEVEL allows. Compiled
// once, at the baseline level.
#include <cstdlib>
#include <strings.h>
#include <string>
#include <vector>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include "level.h"

namespace core_ops::cpu_levels {
namespace {

// The level names of native/build.py's MACHINE_LEVELS, by CORE_OPS_CPU_LEVEL_ID.
#if defined(__aarch64__)
constexpr const char* kNames[] = {"neon"};
#else
constexpr const char* kNames[] = {"baseline", "avx2", "avx512"};
#endif
constexpr int kLevels = sizeof(kNames) / sizeof(kNames[0]);

std::vector<Registration>& registered(int level) {
  static std::vector<Registration> lists[kLevels];
  return lists[level];
}

// The highest level this CPU (and its OS, which must save the wider registers) runs.
int cpu_supports() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return 2;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
  return 0;
}

// CORE_OPS_CPU_LEVEL's level, or kLevels - 1 when unset. core_ops/_environment.py
// refuses any other value at import, before this library loads; here an unknown one
// counts as unset.
int requested() {
  const char* value = std::getenv("CORE_OPS_CPU_LEVEL");
  if (value == nullptr || *value == '\0') return kLevels - 1;
  for (int i = 0; i < kLevels; ++i) {
    if (strcasecmp(value, kNames[i]) == 0) return i;
  }
  return kLevels - 1;
}

struct Choice {
  int level = -1;  // -1: no level compiled in runs here
  std::string why;
};

const Choice& choice() {
  static const Choice c = [] {
    Choice out;
    const int cpu = cpu_supports();
    const int want = requested();
    const int ceiling = want < cpu ? want : cpu;
    std::string compiled;
    for (int i = 0; i < kLevels; ++i) {
      if (!registered(i).empty()) compiled += std::string(compiled.empty() ? "" : ", ") + kNames[i];
    }
    for (int i = ceiling; i >= 0; --i) {
      if (!registered(i).empty()) { out.level = i; break; }
    }
    out.why = std::string("this CPU runs ") + kNames[cpu] + "; " +
              (want < kLevels - 1 || std::getenv("CORE_OPS_CPU_LEVEL") ? std::string("CORE_OPS_CPU_LEVEL=") + kNames[want] + "; " : "") +
              "compiled in: " + compiled;
    return out;
  }();
  return c;
}

// "avx2 (this CPU runs avx512; compiled in: baseline, avx2, avx512)", or "none (...)".
std::string native_cpu_level(torch::stable::Tensor) {
  const Choice& c = choice();
  return std::string(c.level < 0 ? "none" : kNames[c.level]) + " (" + c.why + ")";
}

}  // namespace

void add(int level, Registration f) {
  if (level >= 0 && level < kLevels) registered(level).push_back(f);
}

}  // namespace core_ops::cpu_levels

STABLE_TORCH_LIBRARY_IMPL(core_ops, CPU, m) {
  using namespace core_ops::cpu_levels;
  m.impl("native_cpu_level", TORCH_BOX(&native_cpu_level));
  const Choice& c = choice();
  if (c.level < 0) return;
  for (Registration f : registered(c.level)) f(m);
}

#include "core_ops/glibc_floor_definitions.h"  // Note [glibc 2.28]
