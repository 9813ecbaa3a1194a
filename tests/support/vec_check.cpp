// Checks every operation of core_ops/csrc/cpu/vec.h against scalar code, lane by lane,
// on edge values (NaN, infinities, -0.0, denormals, rounding ties, values past the
// half range) and seeded random ones. tests/test_cpu_vec.py compiles it once per
// level with that level's flags and runs it as `vec_check <level>`; it prints the
// first failures and a summary line, and exits 1 if anything failed.
//
// What "as scalar code" means follows Note [Vector results as at::vec] in vec.h: bit for
// bit, except that a NaN from + - * / sqrt fmadd need only be a NaN (which NaN
// scalar code returns depends on the order the compiler puts the operands in).
#include "vec.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

namespace v = core_ops::cpu::vec;
using Half = torch::headeronly::Half;
using BFloat16 = torch::headeronly::BFloat16;
using fVec = v::Vectorized<float>;
using iVec = v::Vectorized<int32_t>;
constexpr int kLanes = fVec::size();

#if defined(CORE_OPS_VEC_AVX512)
const char* const kLevel = "avx512";
#elif defined(CORE_OPS_VEC_AVX2)
const char* const kLevel = "avx2";
#elif defined(CORE_OPS_VEC_GENERIC)
const char* const kLevel = "generic";
#elif defined(__aarch64__)
const char* const kLevel = "neon";
#else
const char* const kLevel = "baseline";
#endif
#if defined(CORE_OPS_VEC_AVX512) || defined(CORE_OPS_VEC_AVX2)
constexpr bool kSimd = true;
#else
constexpr bool kSimd = false;
#endif
#if defined(CORE_OPS_VEC_AVX512) || defined(CORE_OPS_VEC_AVX2) || (defined(CORE_OPS_VEC_NEON) && defined(__aarch64__))
constexpr bool kFusedFma = true;
#else
constexpr bool kFusedFma = false;
#endif

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

int64_t checks = 0, failures = 0;

void fail(const std::string& what) {
  if (++failures <= 20) std::printf("FAIL %s\n", what.c_str());
}

std::string hex(uint32_t b) {
  char s[16];
  std::snprintf(s, sizeof(s), "%08" PRIx32, b);
  return s;
}

// got must be want bit for bit; or, with nan_is_nan, both NaN.
void expect_float(const char* op, float got, float want, const std::vector<float>& in, bool nan_is_nan) {
  ++checks;
  if (bits(got) == bits(want) || (nan_is_nan && std::isnan(got) && std::isnan(want))) return;
  std::string s = std::string(op) + "(";
  for (float x : in) s += hex(bits(x)) + " ";
  fail(s + ") = " + hex(bits(got)) + ", want " + hex(bits(want)));
}

void expect_int(const char* op, int64_t got, int64_t want, const std::vector<int64_t>& in) {
  ++checks;
  if (got == want) return;
  std::string s = std::string(op) + "(";
  for (int64_t x : in) s += std::to_string(x) + " ";
  fail(s + ") = " + std::to_string(got) + ", want " + std::to_string(want));
}

uint32_t mask(bool b) { return b ? 0xFFFFFFFFu : 0u; }

// Edge floats: every class and the boundaries the conversions round at.
std::vector<float> edge_floats() {
  std::vector<uint32_t> b = {
      0x00000000, 0x80000000,                          // +-0
      0x00000001, 0x80000001, 0x007FFFFF, 0x00400000,  // float denormals
      0x00800000, 0x80800000,                          // FLT_MIN
      0x3F800000, 0xBF800000, 0x3FC00000, 0x40490FDB,  // 1, -1, 1.5, pi
      0x7F7FFFFF, 0xFF7FFFFF,                          // FLT_MAX
      0x7F800000, 0xFF800000,                          // +-inf
      0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7FFFFFFF,  // quiet NaNs
      0x7F800001, 0xFFA00001,                          // signaling NaNs
      0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001,  // 65504 (half max) .. 65520 (-> inf)
      0xC77FF000, 0x47800000,                          // -65520, 65536
      0x38800000, 0x387FFFFF, 0x387FF000,              // half's smallest normal, just below
      0x33800000, 0x33000000, 0x33000001, 0x33C00000,  // half's smallest subnormal, ties at 2^-25, 3*2^-25
      0x32FFFFFF, 0xB3000000,
      0x3F801000, 0x3F803000, 0x3F802FFF, 0x3F801001,  // half ties at 1 + 2^-11 (to even: down / up)
      0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,  // bfloat16 ties at 1 + 2^-8
      0x7F7F8000, 0x7F7F7FFF, 0xFF7F8000,              // bfloat16: rounds to inf / to max
  };
  std::vector<float> out;
  for (uint32_t x : b) out.push_back(from_bits(x));
  return out;
}

// Vectors of lanes drawn from `pool` (each lane its own draw), `count` of them.
std::vector<std::vector<float>> float_cases(const std::vector<float>& edges, std::mt19937& rng, int count) {
  std::vector<std::vector<float>> out;
  // Every edge value in every lane position at least once.
  for (size_t k = 0; k < edges.size(); ++k) {
    std::vector<float> lanes(kLanes);
    for (int i = 0; i < kLanes; ++i) lanes[i] = edges[(k + i * 7) % edges.size()];
    out.push_back(lanes);
  }
  for (int n = 0; n < count; ++n) {
    std::vector<float> lanes(kLanes);
    for (int i = 0; i < kLanes; ++i) {
      const uint32_t r = rng();
      switch (rng() % 4) {
        case 0: lanes[i] = edges[r % edges.size()]; break;
        case 1: lanes[i] = from_bits((r & 0x807FFFFFu) | ((100u + r % 56u) << 23)); break;  // near 1
        default: lanes[i] = from_bits(r);
      }
    }
    out.push_back(lanes);
  }
  return out;
}

fVec load(const std::vector<float>& lanes) { return fVec::loadu(lanes.data()); }
std::vector<float> lanes_of(const fVec& x) {
  std::vector<float> out(kLanes);
  x.store(out.data());
  return out;
}
std::vector<int32_t> lanes_of(const iVec& x) {
  std::vector<int32_t> out(kLanes);
  x.store(out.data());
  return out;
}

float scalar_max(float a, float b) {
  if (kSimd) return std::isnan(a) || std::isnan(b) ? from_bits(0xFFFFFFFFu) : (a > b ? a : b);
  return std::isnan(a) ? a : (a > b ? a : b);
}
float scalar_min(float a, float b) {
  if (kSimd) return std::isnan(a) || std::isnan(b) ? from_bits(0xFFFFFFFFu) : (a < b ? a : b);
  return std::isnan(a) ? a : (a < b ? a : b);
}

void check_float_ops(const std::vector<std::vector<float>>& cases) {
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& A = cases[k];
    const auto& B = cases[(k * 31 + 1) % cases.size()];
    const auto& C = cases[(k * 17 + 5) % cases.size()];
    const fVec a = load(A), b = load(B), c = load(C);
    const auto add = lanes_of(a + b), sub = lanes_of(a - b), mul = lanes_of(a * b), div = lanes_of(a / b);
    const auto sq = lanes_of(a.sqrt()), ab = lanes_of(a.abs()), ng = lanes_of(a.neg()), un = lanes_of(-a);
    const auto fm = lanes_of(v::fmadd(a, b, c));
    const auto mx = lanes_of(v::maximum(a, b)), mn = lanes_of(v::minimum(a, b));
    const auto eq = lanes_of(a == b), ne = lanes_of(a != b), lt = lanes_of(a < b), le = lanes_of(a <= b);
    const auto gt = lanes_of(a > b), ge = lanes_of(a >= b);
    const auto an = lanes_of(a & b), orr = lanes_of(a | b), xr = lanes_of(a ^ b), nt = lanes_of(~a);
    const auto bl = lanes_of(fVec::blendv(a, b, a < c));
    fVec acc = a;
    acc += b;
    acc *= c;
    acc -= a;
    acc /= b;
    const auto compound = lanes_of(acc);
    const auto as_int = lanes_of(v::cast<int32_t>(a));
    const auto back = lanes_of(v::cast<float>(v::cast<int32_t>(a)));
    for (int i = 0; i < kLanes; ++i) {
      const float x = A[i], y = B[i], z = C[i];
      const std::vector<float> xy = {x, y};
      expect_float("add", add[i], x + y, xy, true);
      expect_float("sub", sub[i], x - y, xy, true);
      expect_float("mul", mul[i], x * y, xy, true);
      expect_float("div", div[i], x / y, xy, true);
      expect_float("sqrt", sq[i], std::sqrt(x), {x}, true);
      expect_float("abs", ab[i], from_bits(bits(x) & 0x7FFFFFFFu), {x}, false);
      expect_float("neg", ng[i], from_bits(bits(x) ^ 0x80000000u), {x}, false);
      expect_float("unary -", un[i], from_bits(bits(x) ^ 0x80000000u), {x}, false);
      const float fused = kFusedFma ? std::fma(x, y, z) : x * y + z;  // -ffp-contract=off: two roundings
      expect_float("fmadd", fm[i], fused, {x, y, z}, true);
      expect_float("maximum", mx[i], scalar_max(x, y), xy, false);
      expect_float("minimum", mn[i], scalar_min(x, y), xy, false);
      expect_float("==", eq[i], from_bits(mask(x == y)), xy, false);
      expect_float("!=", ne[i], from_bits(mask(x != y)), xy, false);
      expect_float("<", lt[i], from_bits(mask(x < y)), xy, false);
      expect_float("<=", le[i], from_bits(mask(x <= y)), xy, false);
      expect_float(">", gt[i], from_bits(mask(x > y)), xy, false);
      expect_float(">=", ge[i], from_bits(mask(x >= y)), xy, false);
      expect_float("&", an[i], from_bits(bits(x) & bits(y)), xy, false);
      expect_float("|", orr[i], from_bits(bits(x) | bits(y)), xy, false);
      expect_float("^", xr[i], from_bits(bits(x) ^ bits(y)), xy, false);
      expect_float("~", nt[i], from_bits(~bits(x)), {x}, false);
      expect_float("blendv", bl[i], x < z ? y : x, {x, y, z}, false);
      expect_float("+= *= -= /=", compound[i], ((x + y) * z - x) / y, {x, y, z}, true);
      expect_int("cast<int32_t>", as_int[i], int32_t(bits(x)), {int64_t(bits(x))});
      expect_float("cast<float>(cast<int32_t>)", back[i], x, {x}, false);
    }
    // Broadcast.
    const auto bc = lanes_of(fVec(A[0]));
    for (int i = 0; i < kLanes; ++i) expect_float("fVec(x)", bc[i], A[0], {A[0]}, false);
  }
}

// The lane fold of Note [Vector results as at::vec]: at AVX2 / AVX-512 lane j takes
// op(v[j], v[j ^ s]) for s = half the lanes, a quarter, ..., 1; at baseline lane 0
// takes op(acc, lane i) for i = 1, 2, ...
template <typename Op>
float scalar_fold(const std::vector<float>& lanes, const Op& op) {
  std::vector<float> v = lanes;
  if (kSimd) {
    for (int s = kLanes / 2; s >= 1; s /= 2) {
      std::vector<float> w = v;
      for (int j = 0; j < kLanes; ++j) w[j] = op(v[j], v[j ^ s]);
      v = w;
    }
    return v[0];
  }
  float acc = v[0];
  for (int i = 1; i < kLanes; ++i) acc = op(acc, v[i]);
  return acc;
}

void check_reduce(const std::vector<std::vector<float>>& cases) {
  for (const auto& lanes : cases) {
    const fVec x = load(lanes);
    // The kernels' lambdas take non-const references.
    const float sum = v::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, x);
    const float top = v::vec_reduce_all<float>([](fVec& a, fVec& b) { return v::maximum(a, b); }, x);
    expect_float("vec_reduce_all(+)", sum, scalar_fold(lanes, [](float a, float b) { return a + b; }), lanes, true);
    expect_float("vec_reduce_all(maximum)", top, scalar_fold(lanes, scalar_max), lanes, false);
  }
}

void check_int_ops(std::mt19937& rng) {
  const std::vector<int32_t> edges = {0, 1, -1, 2, -2, 7, 31, 32, 33, 0x7FFF, 0xFFFF, 0x10000, -0x10000,
                                      INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1, 1000, -1000};
  const std::vector<int32_t> counts = {-1, 0, 1, 7, 8, 16, 30, 31, 32, 33, 1000, INT32_MIN, INT32_MAX};
  for (int n = 0; n < 4000; ++n) {
    std::vector<int32_t> A(kLanes), B(kLanes), S(kLanes);
    for (int i = 0; i < kLanes; ++i) {
      A[i] = n % 2 ? edges[rng() % edges.size()] : int32_t(rng());
      B[i] = n % 3 ? edges[rng() % edges.size()] : int32_t(rng());
      if (rng() % 8 == 0) B[i] = A[i];
      S[i] = counts[rng() % counts.size()];
    }
    const iVec a = iVec::loadu(A.data()), b = iVec::loadu(B.data()), s = iVec::loadu(S.data());
    const auto add = lanes_of(a + b), sub = lanes_of(a - b), mul = lanes_of(a * b);
    const auto an = lanes_of(a & b), orr = lanes_of(a | b), xr = lanes_of(a ^ b), nt = lanes_of(~a);
    const auto shl = lanes_of(a << s), shr = lanes_of(a >> s);
    const auto mx = lanes_of(v::maximum(a, b)), mn = lanes_of(v::minimum(a, b));
    const auto eq = lanes_of(a == b), ne = lanes_of(a != b), lt = lanes_of(a < b), le = lanes_of(a <= b);
    const auto gt = lanes_of(a > b), ge = lanes_of(a >= b);
    const auto ab = lanes_of(a.abs()), ng = lanes_of(a.neg());
    const auto bl = lanes_of(iVec::blendv(a, b, a > b));
    const auto bc = lanes_of(iVec(A[0]));
    for (int i = 0; i < kLanes; ++i) {
      const int32_t x = A[i], y = B[i], c = S[i];
      const uint32_t ux = uint32_t(x), uy = uint32_t(y);
      const std::vector<int64_t> xy = {x, y};
      expect_int("int +", add[i], int32_t(ux + uy), xy);
      expect_int("int -", sub[i], int32_t(ux - uy), xy);
      expect_int("int *", mul[i], int32_t(ux * uy), xy);
      expect_int("int &", an[i], x & y, xy);
      expect_int("int |", orr[i], x | y, xy);
      expect_int("int ^", xr[i], x ^ y, xy);
      expect_int("int ~", nt[i], ~x, {x});
      // Counts past 31 (or negative): << gives 0, >> the sign.
      expect_int("int <<", shl[i], uint32_t(c) < 32 ? int32_t(ux << c) : 0, {x, c});
      expect_int("int >>", shr[i], x >> (uint32_t(c) < 32 ? c : 31), {x, c});
      expect_int("int maximum", mx[i], x > y ? x : y, xy);
      expect_int("int minimum", mn[i], x < y ? x : y, xy);
      expect_int("int ==", eq[i], x == y ? -1 : 0, xy);
      expect_int("int !=", ne[i], x != y ? -1 : 0, xy);
      expect_int("int <", lt[i], x < y ? -1 : 0, xy);
      expect_int("int <=", le[i], x <= y ? -1 : 0, xy);
      expect_int("int >", gt[i], x > y ? -1 : 0, xy);
      expect_int("int >=", ge[i], x >= y ? -1 : 0, xy);
      expect_int("int abs", ab[i], x < 0 ? int32_t(0u - ux) : x, {x});
      expect_int("int neg", ng[i], int32_t(0u - ux), {x});
      expect_int("int blendv", bl[i], x > y ? y : x, xy);
      expect_int("iVec(x)", bc[i], A[0], {A[0]});
    }
  }
}

void check_gather(std::mt19937& rng) {
  std::vector<float> ftab(256);
  std::vector<int32_t> itab(256);
  for (int i = 0; i < 256; ++i) {
    ftab[i] = from_bits(rng());
    itab[i] = int32_t(rng());
  }
  for (int n = 0; n < 2000; ++n) {
    std::vector<int32_t> index(kLanes);
    for (int i = 0; i < kLanes; ++i) index[i] = int32_t(rng() % 128);
    const iVec idx = iVec::loadu(index.data());
    const auto f4 = lanes_of(v::gather<sizeof(float)>(ftab.data(), idx));
    const auto i4 = lanes_of(v::gather<sizeof(int32_t)>(itab.data(), idx));
    const auto f8 = lanes_of(v::gather<8>(ftab.data(), idx));  // index * 8 bytes: every other float
    const auto i1 = lanes_of(v::gather<1>(itab.data(), idx * iVec(4)));  // byte offsets
    for (int i = 0; i < kLanes; ++i) {
      const int32_t j = index[i];
      expect_float("gather<4>(float)", f4[i], ftab[j], {}, false);
      expect_int("gather<4>(int32_t)", i4[i], itab[j], {j});
      expect_float("gather<8>(float)", f8[i], ftab[2 * j], {}, false);
      expect_int("gather<1>(int32_t)", i1[i], itab[j], {j});
    }
  }
}

// Partial loads and stores: lanes past `count` are zero when loaded and left alone
// when stored.
template <typename V, typename Lane>
void check_partial(const char* what) {
  constexpr int n = V::size();
  std::vector<Lane> src(n), dst(n + 1);
  for (int i = 0; i < n; ++i) std::memset(&src[i], 0x11 * (i % 15 + 1), sizeof(Lane));
  for (int count = 0; count <= n; ++count) {
    std::vector<Lane> got(n);
    V::loadu(src.data(), count).store(got.data());
    std::memset(dst.data(), 0xAB, dst.size() * sizeof(Lane));
    V::loadu(src.data()).store(dst.data(), count);
    for (int i = 0; i < n; ++i) {
      Lane zero;
      std::memset(&zero, 0, sizeof(Lane));
      ++checks;
      if (std::memcmp(&got[i], i < count ? &src[i] : &zero, sizeof(Lane)) != 0) {
        fail(std::string(what) + " loadu(p, " + std::to_string(count) + ") lane " + std::to_string(i));
      }
    }
    for (int i = 0; i <= n; ++i) {
      Lane guard;
      std::memset(&guard, 0xAB, sizeof(Lane));
      ++checks;
      if (std::memcmp(&dst[i], i < count ? &src[i] : &guard, sizeof(Lane)) != 0) {
        fail(std::string(what) + " store(p, " + std::to_string(count) + ") lane " + std::to_string(i));
      }
    }
  }
}

// 16-bit floats: every one of the 65536 patterns to float; floats to 16 bits over
// every sign / exponent / top mantissa bits (the high 16 bits of a float) with the low
// bits at and around both formats' rounding ties, then the edge values.
template <typename T>
void check_conversions(const std::vector<float>& edges) {
  constexpr bool kHalf = std::is_same_v<T, Half>;
  const char* name = kHalf ? "half" : "bfloat16";
  using hVec = v::Vectorized<T>;
  static_assert(hVec::size() == 2 * kLanes, "a 16-bit vector holds two float vectors' lanes");
  constexpr int n = hVec::size();
  std::vector<uint16_t> patterns(65536);
  for (int i = 0; i < 65536; ++i) patterns[i] = uint16_t(i);
  for (int at = 0; at < 65536; at += n) {
    const auto [lo, hi] = v::convert_to_float<T>(hVec::loadu(patterns.data() + at));
    const auto a = lanes_of(lo), b = lanes_of(hi);
    for (int i = 0; i < n; ++i) {
      const uint16_t h = patterns[at + i];
      const float want = static_cast<float>(T(h, T::from_bits()));
      expect_float(kHalf ? "half -> float" : "bfloat16 -> float", i < kLanes ? a[i] : b[i - kLanes], want,
                   {from_bits(h)}, false);
    }
  }
  std::vector<float> values;
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x2FFF, 0x3000, 0x3001,
                           0x7FFF, 0x8000, 0x8001, 0xFFFF};
  for (uint32_t high = 0; high < 65536; ++high) {
    for (uint32_t low : lows) values.push_back(from_bits(high << 16 | low));
  }
  values.insert(values.end(), edges.begin(), edges.end());
  while (values.size() % n) values.push_back(0.f);
  for (size_t at = 0; at < values.size(); at += n) {
    std::vector<uint16_t> got(n);
    v::convert_from_float<T>(fVec::loadu(&values[at]), fVec::loadu(&values[at + kLanes])).store(got.data());
    for (int i = 0; i < n; ++i) {
      const float x = values[at + i];
      uint16_t want = T(x).x;
      // bfloat16 NaNs: at::vec's AVX2 / AVX-512 conversion makes every one 0xFFFF.
      if (!kHalf && kSimd && std::isnan(x)) want = 0xFFFF;
      ++checks;
      if (got[i] != want) fail(std::string("float -> ") + name + "(" + hex(bits(x)) + ") = " + hex(got[i]) + ", want " + hex(want));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) != kLevel) {
    std::printf("FAIL built as level %s, expected %s\n", kLevel, argc == 2 ? argv[1] : "(none given)");
    return 1;
  }
  const int want_lanes = std::string(kLevel) == "avx512" ? 16 : 8;
  if (kLanes != want_lanes || iVec::size() != kLanes) fail("lane count " + std::to_string(kLanes));
  std::mt19937 rng(20240611);
  const auto edges = edge_floats();
  const auto cases = float_cases(edges, rng, 30000);
  check_float_ops(cases);
  check_reduce(cases);
  check_int_ops(rng);
  check_gather(rng);
  check_partial<fVec, float>("float");
  check_partial<iVec, int32_t>("int32_t");
  check_partial<v::Vectorized<Half>, uint16_t>("Half");
  check_partial<v::Vectorized<BFloat16>, uint16_t>("BFloat16");
  check_conversions<Half>(edges);
  check_conversions<BFloat16>(edges);
  std::printf("vec_check %s lanes=%d checks=%" PRId64 " failures=%" PRId64 "\n", kLevel, kLanes, checks, failures);
  return failures == 0 ? 0 : 1;
}
