// The CUDA library's copy of Note [glibc 2.28]'s definitions (host code only).
#include "core_ops/glibc_floor_definitions.h"
