// The SwiGLU activation for training on CPU, forward and backward, as XLA FFI handlers (built
// by cpu_swiglu.py).
//
// Why: XLA:CPU runs the dense MLP's silu(gate) * up (`model.mlp`) as three passes over memory
// forward (the sigmoid, silu, the product: autodiff keeps the first two for the backward) and
// two backward; ~0.25 s of SmolLM2-135M's update step on one core, for 30 layers of 1,024 x
// 1,536 floats (a profile of one update step; experiments/bench/RESULTS.md, "SmolLM2's update
// step against transformers on one core"). Here one pass each way.
//
//   avalon_swiglu_fwd(gate [n], up [n]) -> h [n]:   h = gate s up,  s = 1 / (1 + exp(-gate))
//   avalon_swiglu_bwd(gate, up, dh) -> dgate, dup:  dgate = dh up s (1 + gate (1 - s)),
//                                                    dup = dh gate s

#include <cstdint>

#include "cpu_ffi.h"
#include "cpu_parallel.h"
#include "cpu_vector.h"

namespace {

using avalon::Exp;
using avalon::F32Buffer;
using avalon::F32Result;
using avalon::kLanes;
using avalon::Load;
using avalon::PooledBinding;
using avalon::Splat;
using avalon::Store;
using avalon::Vec;

constexpr int64_t kPerPart = 1 << 14;  // elements per part of the work split over XLA's threads

inline Vec Sigmoid(Vec g) { return Splat(1.0f) / (Splat(1.0f) + Exp(-g)); }

inline float Sigmoid(float g) {
  Vec v = Splat(g);
  return Sigmoid(v)[0];  // the vector path's rounding for the tail too
}

ffi::Error ForwardImpl(ffi::ThreadPool pool, F32Buffer gate, F32Buffer up, F32Result h) {
  const int64_t n = gate.element_count();
  if (up.element_count() != static_cast<size_t>(n)) {
    return ffi::Error::InvalidArgument("avalon swiglu: gate and up must have one shape");
  }
  const float *gp = gate.typed_data(), *up_ = up.typed_data();
  float* hp = h->typed_data();
  avalon::ParallelFor(pool, (n + kPerPart - 1) / kPerPart, [=](int64_t p) {
    const int64_t lo = p * kPerPart, hi = lo + kPerPart < n ? lo + kPerPart : n;
    int64_t i = lo;
    for (; i + kLanes <= hi; i += kLanes) {
      const Vec g = Load(gp + i);
      Store(hp + i, g * Sigmoid(g) * Load(up_ + i));
    }
    for (; i < hi; ++i) hp[i] = gp[i] * Sigmoid(gp[i]) * up_[i];
  });
  return ffi::Error::Success();
}

ffi::Error BackwardImpl(ffi::ThreadPool pool, F32Buffer gate, F32Buffer up, F32Buffer dh,
                        F32Result dgate, F32Result dup) {
  const int64_t n = gate.element_count();
  if (up.element_count() != static_cast<size_t>(n) ||
      dh.element_count() != static_cast<size_t>(n)) {
    return ffi::Error::InvalidArgument("avalon swiglu: gate, up and dh must have one shape");
  }
  const float *gp = gate.typed_data(), *up_ = up.typed_data(), *dp = dh.typed_data();
  float *dgp = dgate->typed_data(), *dup_ = dup->typed_data();
  avalon::ParallelFor(pool, (n + kPerPart - 1) / kPerPart, [=](int64_t p) {
    const int64_t lo = p * kPerPart, hi = lo + kPerPart < n ? lo + kPerPart : n;
    const Vec one = Splat(1.0f);
    int64_t i = lo;
    for (; i + kLanes <= hi; i += kLanes) {
      const Vec g = Load(gp + i), u = Load(up_ + i), d = Load(dp + i), s = Sigmoid(g);
      Store(dgp + i, d * u * (s * (one + g * (one - s))));
      Store(dup_ + i, d * (g * s));
    }
    for (; i < hi; ++i) {
      const float g = gp[i], s = Sigmoid(g);
      dgp[i] = dp[i] * up_[i] * (s * (1.0f + g * (1.0f - s)));
      dup_[i] = dp[i] * (g * s);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonSwigluForward, ForwardImpl,
                              PooledBinding().Arg<F32Buffer>().Arg<F32Buffer>().Ret<F32Buffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonSwigluBackward, BackwardImpl,
                              PooledBinding()
                                  .Arg<F32Buffer>().Arg<F32Buffer>().Arg<F32Buffer>()
                                  .Ret<F32Buffer>().Ret<F32Buffer>());
