// Token log-probs and entropies from rows of logits, forward and backward, as XLA FFI handlers
// (built by cpu_log_softmax.py).
//
// Why: the update step's log-probs (`rl.logprobs`) reduce each row of [positions, vocabulary]
// logits three times (max, sum of exponentials, the entropy's sum) and its backward makes the
// softmax again; XLA:CPU runs each row reduction as a tree of reduce-window passes at ~3 GB/s,
// ~0.5 s of SmolLM2-135M's update step on one core (docs/results_history.md,
// "Where SmolLM2's update step goes (one core)").
// Here a row (196 KB at a 49,152-token vocabulary, in L2) is read twice in the forward (its
// max, then the exponentials' two sums) and once in the backward.
//
//   avalon_logprobs_fwd(logits [n, V], targets [n] int32) -> logp [n], entropy [n], lse [n]
//     lse = log sum_j exp(x_j); logp = x_t - lse; entropy = lse - sum_j exp(x_j - lse) x_j.
//     Targets index as jnp.take_along_axis does: t in [-V, 0) counts from the end, and a target
//     outside [-V, V) gives logp NaN (its fill) and no gradient.
//   avalon_logprobs_bwd(logits, targets, lse, g [n]) -> dlogits [n, V]
//     dlogits_j = g (1[j = t] - exp(x_j - lse)): the gradient of logp (the entropy is a
//     diagnostic and carries none).

#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu_ffi.h"
#include "cpu_parallel.h"
#include "cpu_vector.h"

namespace {

using avalon::Exp;
using avalon::F32Buffer;
using avalon::F32Result;
using avalon::HorizontalMax;
using avalon::HorizontalSum;
using avalon::kLanes;
using avalon::Load;
using avalon::PooledBinding;
using avalon::S32Buffer;
using avalon::Splat;
using avalon::Store;
using avalon::Vec;

// Rows per part of the work split over XLA's threads: enough that a hand-over is negligible.
constexpr int64_t kRowsPerPart = 16;
constexpr int64_t kBlock = 16;  // vectors per block of the forward's sums

// The column target t picks, or -1 (jnp.take_along_axis: negative indices count from the end).
inline int64_t Column(int32_t t, int64_t V) {
  const int64_t c = t < 0 ? t + V : t;
  return c >= 0 && c < V ? c : -1;
}

void ForwardRow(const float* x, int64_t V, int32_t t, float* logp, float* entropy, float* lse) {
  const int64_t whole = V / kLanes * kLanes;
  float m = -INFINITY;
  if (whole > 0) {
    Vec mv = Load(x);
    for (int64_t j = kLanes; j < whole; j += kLanes) {
      const Vec v = Load(x + j);
      mv = v > mv ? v : mv;
    }
    m = HorizontalMax(mv);
  }
  for (int64_t j = whole; j < V; ++j) m = x[j] > m ? x[j] : m;
  const Vec mv = Splat(m);
  // Two levels of sums (blocks of kBlock vectors, then the blocks' sums), so a lane's rounding
  // grows with kBlock + V / (16 kBlock) terms rather than V / 16.
  Vec s{}, w{};
  for (int64_t j0 = 0; j0 < whole; j0 += kBlock * kLanes) {
    const int64_t j1 = j0 + kBlock * kLanes < whole ? j0 + kBlock * kLanes : whole;
    Vec bs{}, bw{};
    for (int64_t j = j0; j < j1; j += kLanes) {
      const Vec v = Load(x + j);
      const Vec e = Exp(v - mv);
      bs += e;
      bw += e * v;
    }
    s += bs;
    w += bw;
  }
  float sum = HorizontalSum(s), weighted = HorizontalSum(w);
  for (int64_t j = whole; j < V; ++j) {
    const float e = std::exp(x[j] - m);
    sum += e;
    weighted += e * x[j];
  }
  const float l = m + std::log(sum);
  *lse = l;
  *entropy = l - weighted / sum;
  const int64_t c = Column(t, V);
  *logp = c >= 0 ? x[c] - l : std::numeric_limits<float>::quiet_NaN();
}

void BackwardRow(const float* x, int64_t V, int32_t t, float lse, float g, float* dx) {
  const int64_t whole = V / kLanes * kLanes;
  const Vec lv = Splat(lse), gv = Splat(-g);
  for (int64_t j = 0; j < whole; j += kLanes) Store(dx + j, Exp(Load(x + j) - lv) * gv);
  for (int64_t j = whole; j < V; ++j) dx[j] = -g * std::exp(x[j] - lse);
  const int64_t c = Column(t, V);
  if (c >= 0) dx[c] += g;
}

ffi::Error Rows(const F32Buffer& logits, const S32Buffer& targets, int64_t* n, int64_t* V) {
  auto ld = logits.dimensions();
  auto td = targets.dimensions();
  if (ld.size() != 2 || td.size() != 1 || td[0] != ld[0]) {
    return ffi::Error::InvalidArgument("avalon logprobs: expects logits [n, V], targets [n]");
  }
  *n = ld[0], *V = ld[1];
  return ffi::Error::Success();
}

ffi::Error ForwardImpl(ffi::ThreadPool pool, F32Buffer logits, S32Buffer targets, F32Result logp,
                       F32Result entropy, F32Result lse) {
  int64_t n, V;
  ffi::Error ok = Rows(logits, targets, &n, &V);
  if (ok.failure()) return ok;
  const float* x = logits.typed_data();
  const int32_t* t = targets.typed_data();
  float *lp = logp->typed_data(), *ent = entropy->typed_data(), *ls = lse->typed_data();
  const int64_t parts = (n + kRowsPerPart - 1) / kRowsPerPart;
  avalon::ParallelFor(pool, parts, [=](int64_t p) {
    for (int64_t r = p * kRowsPerPart; r < n && r < (p + 1) * kRowsPerPart; ++r) {
      ForwardRow(x + r * V, V, t[r], lp + r, ent + r, ls + r);
    }
  });
  return ffi::Error::Success();
}

ffi::Error BackwardImpl(ffi::ThreadPool pool, F32Buffer logits, S32Buffer targets, F32Buffer lse,
                        F32Buffer g, F32Result dlogits) {
  int64_t n, V;
  ffi::Error ok = Rows(logits, targets, &n, &V);
  if (ok.failure()) return ok;
  if (lse.element_count() != static_cast<size_t>(n) ||
      g.element_count() != static_cast<size_t>(n)) {
    return ffi::Error::InvalidArgument("avalon logprobs: lse and g must be [n]");
  }
  const float *x = logits.typed_data(), *ls = lse.typed_data(), *gp = g.typed_data();
  const int32_t* t = targets.typed_data();
  float* dx = dlogits->typed_data();
  const int64_t parts = (n + kRowsPerPart - 1) / kRowsPerPart;
  avalon::ParallelFor(pool, parts, [=](int64_t p) {
    for (int64_t r = p * kRowsPerPart; r < n && r < (p + 1) * kRowsPerPart; ++r) {
      BackwardRow(x + r * V, V, t[r], ls[r], gp[r], dx + r * V);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonLogprobsForward, ForwardImpl,
                              PooledBinding()
                                  .Arg<F32Buffer>().Arg<S32Buffer>()
                                  .Ret<F32Buffer>().Ret<F32Buffer>().Ret<F32Buffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonLogprobsBackward, BackwardImpl,
                              PooledBinding()
                                  .Arg<F32Buffer>().Arg<S32Buffer>().Arg<F32Buffer>()
                                  .Arg<F32Buffer>()
                                  .Ret<F32Buffer>());
