// 16-float vectors (GCC/clang vector extensions) and the lane operations the FFI kernels beside
// this file share: loads and stores, a broadcast, horizontal max and sum, and exp.
#ifndef AVALON_BACKENDS_CPU_VECTOR_H_
#define AVALON_BACKENDS_CPU_VECTOR_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace avalon {

typedef float Vec __attribute__((vector_size(64)));     // 16 floats
typedef int32_t IVec __attribute__((vector_size(64)));  // 16 int32 (masks, indices)
constexpr int64_t kLanes = 16;

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(Vec));
  return v;
}
inline void Store(float* p, Vec v) { std::memcpy(p, &v, sizeof(Vec)); }
inline IVec LoadI(const int32_t* p) {
  IVec v;
  std::memcpy(&v, p, sizeof(IVec));
  return v;
}
// All lanes x, as one broadcast (`Vec{} + x` compiles to an add and a broadcast on the shuffle
// port, which the FMAs need too).
inline Vec Splat(float x) { return Vec{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

// The horizontal max and sum as AVX-512's shuffle trees where the build has them: lane by lane,
// each took ~30 lane extractions, a third of the attention forward's softmax (a profile of the kernel). The
// sum's tree pairs lanes i and i + w for w = 8, 4, 2, 1, as the loop below: the same result.
inline float HorizontalMax(Vec v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps(v);
#else
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
#endif
}
inline float HorizontalSum(Vec v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(v);
#else
  // Pairwise, so the sum does not depend on a long serial chain of rounding.
  for (int w = kLanes / 2; w >= 1; w /= 2) {
    for (int i = 0; i < w; ++i) v[i] += v[i + w];
  }
  return v[0];
#endif
}

// exp(x) for each lane, |relative error| < 2e-7 for x in [-87, 88]; x < -87.3 gives 0 (masked
// and vanishing probabilities), x = -inf too. Range reduction x = n ln2 + r, |r| <= ln2 / 2, a
// degree-7 Taylor polynomial in r, then 2^n put in the exponent bits.
inline Vec Exp(Vec x) {
  const Vec lo = Splat(-87.3f);
  const IVec dead = x < lo;
  x = x < lo ? lo : x;
  x = x > Splat(88.0f) ? Splat(88.0f) : x;
  const Vec magic = Splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const Vec n = (x * Splat(1.44269504088896341f) + magic) - magic;
  Vec r = x - n * Splat(0.693145751953125f);
  r = r - n * Splat(1.428606765330187e-06f);
  Vec p = Splat(1.0f / 5040.0f);
  p = p * r + Splat(1.0f / 720.0f);
  p = p * r + Splat(1.0f / 120.0f);
  p = p * r + Splat(1.0f / 24.0f);
  p = p * r + Splat(1.0f / 6.0f);
  p = p * r + Splat(0.5f);
  p = p * r + Splat(1.0f);
  p = p * r + Splat(1.0f);
  const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  Vec two_n;
  std::memcpy(&two_n, &bits, sizeof(Vec));
  const Vec y = p * two_n;
  return dead ? Splat(0.0f) : y;
}

}  // namespace avalon

#endif  // AVALON_BACKENDS_CPU_VECTOR_H_
