// Note [glibc 2.28] in glibc_floor.h: what a library defines itself in place of the
// newer imports (hidden: nothing outside the library binds to them). Included by one
// source of each library: cpu/register.cpp, cuda/glibc_floor.cpp.
#pragma once
#if defined(CORE_OPS_GLIBC_FLOOR)
#include <new>
#include <sstream>

extern "C" __attribute__((visibility("hidden"))) char core_ops_libc_single_threaded = 0;

extern "C" __attribute__((visibility("hidden"), used)) void core_ops_default_stringstream(std::stringstream* self)
    __asm__("_ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1Ev");
void core_ops_default_stringstream(std::stringstream* self) {
  new (self) std::stringstream(std::ios_base::in | std::ios_base::out);
}

extern "C" __attribute__((visibility("hidden"), used)) void core_ops_default_ostringstream(std::ostringstream* self)
    __asm__("_ZNSt7__cxx1119basic_ostringstreamIcSt11char_traitsIcESaIcEEC1Ev");
void core_ops_default_ostringstream(std::ostringstream* self) { new (self) std::ostringstream(std::ios_base::out); }
#endif
