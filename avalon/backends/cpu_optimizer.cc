// The update step's optimizer on CPU in one pass per parameter, as XLA FFI handlers (built by
// cpu_optimizer.py).
//
// Why: XLA:CPU runs the step's clip + AdamW + skip guard as several passes over every parameter
// (moments and guard, the update, the update applied and guarded) and its gradient norm's sums
// of squares at ~1.3 GB/s as reduce-window trees, taken twice (the metric and the clip): ~0.75 s
// of SmolLM2-135M's 8.7 s update step on one core (docs/results_history.md,
// SmolLM2's update step with attention and log-probs in C++ and products on MKL).
// Here the norm is one read of each gradient, and the optimizer one pass that reads g, p, mu, nu
// and writes p, mu, nu in place (aliased).
//
//   avalon_sum_squares(x) -> f32[] : sum of x^2 (fp32 lanes, summed in blocks, then doubles).
//   avalon_adamw(p, g, mu, nu, scalars f32[11]) -> p, mu, nu  (outputs aliased to p, mu, nu)
//     scalars: norm, max_norm (<= 0: no clip), b1, b2, eps, eps_root, weight_decay, lr,
//              bc1 = 1 - b1^t, bc2 = 1 - b2^t, ok (0: the step is skipped and p, mu, nu come
//              out as they went in). Per element, in optax's order of operations:
//     g' = norm < max_norm ? g : g / norm * max_norm
//     mu = (1 - b1) g' + b1 mu;  nu = (1 - b2) g'^2 + b2 nu
//     u = (mu / bc1) / (sqrt(nu / bc2 + eps_root) + eps) + weight_decay p;  p = p + u * (-lr)

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "cpu_ffi.h"
#include "cpu_vector.h"

namespace {

using avalon::F32Buffer;
using avalon::F32Result;
using avalon::kLanes;
using avalon::Load;
using avalon::Splat;
using avalon::Store;
using avalon::Vec;

constexpr int64_t kBlock = 1024;  // elements per block of the sum (lanes add 64 terms each)

ffi::Error SumSquaresImpl(F32Buffer x, F32Result out) {
  const float* xp = x.typed_data();
  const int64_t n = static_cast<int64_t>(x.element_count());
  double total = 0.0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    Vec acc[4] = {Vec{}, Vec{}, Vec{}, Vec{}};
    for (int64_t j = i; j < i + kBlock; j += 4 * kLanes) {
      for (int a = 0; a < 4; ++a) {
        const Vec v = Load(xp + j + a * kLanes);
        acc[a] += v * v;
      }
    }
    const Vec s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (int l = 0; l < kLanes; ++l) total += s[l];
  }
  for (; i < n; ++i) total += static_cast<double>(xp[i]) * xp[i];
  *out->typed_data() = static_cast<float>(total);
  return ffi::Error::Success();
}

enum Scalar { kNorm, kMaxNorm, kB1, kB2, kEps, kEpsRoot, kDecay, kLr, kBc1, kBc2, kOk, kScalars };

inline Vec Sqrt(Vec x) {
#if defined(__AVX512F__)
  __m512 v;
  std::memcpy(&v, &x, sizeof(v));
  v = _mm512_sqrt_ps(v);
  std::memcpy(&x, &v, sizeof(v));
#else
  for (int l = 0; l < kLanes; ++l) x[l] = std::sqrt(x[l]);
#endif
  return x;
}

ffi::Error AdamwImpl(F32Buffer p, F32Buffer g, F32Buffer mu, F32Buffer nu, F32Buffer scalars,
                     F32Result p_out, F32Result mu_out, F32Result nu_out) {
  const size_t n = p.element_count();
  if (g.element_count() != n || mu.element_count() != n || nu.element_count() != n ||
      scalars.element_count() != kScalars) {
    return ffi::Error::InvalidArgument("avalon_adamw: p, g, mu, nu differ in size, or scalars "
                                       "is not f32[11]");
  }
  const float* s = scalars.typed_data();
  if (s[kOk] == 0.0f) {  // skipped: the state as it came (in place when aliased)
    const F32Buffer* ins[3] = {&p, &mu, &nu};
    float* outs[3] = {p_out->typed_data(), mu_out->typed_data(), nu_out->typed_data()};
    for (int k = 0; k < 3; ++k) {
      if (outs[k] != ins[k]->typed_data()) std::memcpy(outs[k], ins[k]->typed_data(), n * 4);
    }
    return ffi::Error::Success();
  }
  const bool clip = s[kMaxNorm] > 0.0f && !(s[kNorm] < s[kMaxNorm]);
  const float b1 = s[kB1], b2 = s[kB2], eps = s[kEps], eps_root = s[kEpsRoot];
  const float decay = s[kDecay], neg_lr = -s[kLr], bc1 = s[kBc1], bc2 = s[kBc2];
  const float norm = s[kNorm], max_norm = s[kMaxNorm];
  const float *pp = p.typed_data(), *gp = g.typed_data(), *mp = mu.typed_data(),
              *vp = nu.typed_data();
  float *po = p_out->typed_data(), *mo = mu_out->typed_data(), *vo = nu_out->typed_data();
  const Vec vb1 = Splat(b1), vb2 = Splat(b2), v1b1 = Splat(1.0f - b1), v1b2 = Splat(1.0f - b2);
  const Vec vnorm = Splat(norm), vmax = Splat(max_norm), veps = Splat(eps);
  const Vec veps_root = Splat(eps_root), vdecay = Splat(decay), vlr = Splat(neg_lr);
  const Vec vbc1 = Splat(bc1), vbc2 = Splat(bc2);
  const size_t whole = n / kLanes * kLanes;
  for (size_t i = 0; i < whole; i += kLanes) {
    Vec gv = Load(gp + i);
    if (clip) gv = gv / vnorm * vmax;
    const Vec m = v1b1 * gv + vb1 * Load(mp + i);
    const Vec v = v1b2 * (gv * gv) + vb2 * Load(vp + i);
    const Vec pv = Load(pp + i);
    const Vec u = (m / vbc1) / (Sqrt(v / vbc2 + veps_root) + veps) + vdecay * pv;
    Store(mo + i, m);
    Store(vo + i, v);
    Store(po + i, pv + u * vlr);
  }
  for (size_t i = whole; i < n; ++i) {
    float gv = gp[i];
    if (clip) gv = gv / norm * max_norm;
    const float m = (1.0f - b1) * gv + b1 * mp[i];
    const float v = (1.0f - b2) * (gv * gv) + b2 * vp[i];
    const float u = (m / bc1) / (std::sqrt(v / bc2 + eps_root) + eps) + decay * pp[i];
    mo[i] = m;
    vo[i] = v;
    po[i] = pp[i] + u * neg_lr;
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonSumSquares, SumSquaresImpl,
                              ffi::Ffi::Bind().Arg<F32Buffer>().Ret<F32Buffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonAdamw, AdamwImpl,
                              ffi::Ffi::Bind()
                                  .Arg<F32Buffer>().Arg<F32Buffer>().Arg<F32Buffer>()
                                  .Arg<F32Buffer>().Arg<F32Buffer>()
                                  .Ret<F32Buffer>().Ret<F32Buffer>().Ret<F32Buffer>());
