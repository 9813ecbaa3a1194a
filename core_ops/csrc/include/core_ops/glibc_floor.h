// Note [glibc 2.28]: what keeps the native libraries installable where torch's own
// wheels install (manylinux_2_28: RHEL / Rocky / Alma 8, glibc 2.28, GCC 8's libstdc++).
// Built on a newer system, five imports would raise the floor, and each has an older
// form that does the same:
//   - pow@GLIBC_2.29 (the bias corrections' pow): the pow of the machine's first glibc
//     (GLIBC_2.2.5 on x86-64, GLIBC_2.17 on aarch64), which every glibc still exports
//     (the newer one only drops an errno wrapper);
//   - dlsym@GLIBC_2.34 (torch's stable headers look up newer shims): dlsym of the
//     first glibc, libdl's, which glibc 2.34+ keeps in libc;
//   - __libc_single_threaded@GLIBC_2.32 (libstdc++'s headers read it to skip atomic
//     reference counts): renamed to a flag of our own, always 0 ("threads may run"),
//     so the atomic path is always taken;
//   - the default constructors of std::stringstream / std::ostringstream
//     (GLIBCXX_3.4.26, used by torch's headers for error messages): defined, hidden,
//     from the openmode constructors GCC 5's libstdc++ has.
// Every source of both libraries gets this header first (-include, native/build.py;
// nvcc's host pass too, not its device passes). The definitions are in
// glibc_floor_definitions.h, compiled once per library (cpu/register.cpp,
// cuda/glibc_floor.cpp). tools/wheel.sh's auditwheel then names manylinux_2_28, and
// tools/wheel_check.sh fails if it rises.
#pragma once

#if defined(__linux__) && !defined(__CUDA_ARCH__) && (defined(__x86_64__) || defined(__aarch64__))
#include <features.h>  // defines __GLIBC__ (this header comes before any other)
#if defined(__GLIBC__)
#define CORE_OPS_GLIBC_FLOOR 1
#if defined(__x86_64__)
__asm__(".symver pow,pow@GLIBC_2.2.5");
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
#else
__asm__(".symver pow,pow@GLIBC_2.17");
__asm__(".symver dlsym,dlsym@GLIBC_2.17");
#endif
#define __libc_single_threaded core_ops_libc_single_threaded
#endif
#endif
