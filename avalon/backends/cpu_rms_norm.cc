// RMSNorm for training on CPU, forward and backward, as XLA FFI handlers (built by
// cpu_rms_norm.py).
//
// Why: XLA:CPU runs the model's norm (`model.norms.rms_norm`) as three passes forward and four
// or five backward (the row's mean square as a reduce-window tree, the weight's gradient as a
// column sum over every row): ~0.16 s of SmolLM2-135M's update step on one core, for 60 norms of
// 1,024 x 576 floats (a profile of one update step; experiments/bench/RESULTS.md, "SmolLM2's
// update step against transformers on one core"). Here each row (2.3 KB, in L1) is
// read twice forward (its sum of squares, then the output) and twice backward.
//
//   avalon_rms_norm_fwd(x [n, d], w [d]; eps) -> y [n, d], rstd [n]
//     rstd = 1 / sqrt(mean(x^2) + eps); y = w (x rstd)            (fp32, as rms_norm)
//   avalon_rms_norm_bwd(x, w, rstd, dy) -> dx [n, d], dw [d]
//     xh = x rstd, gw = dy w: dx = rstd (gw - xh mean(gw xh)); dw = sum over rows of dy xh
//     (per part of kRowsPerPart rows, then the parts in order: a fixed order, whatever the
//     threads).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_ffi.h"
#include "cpu_parallel.h"
#include "cpu_vector.h"

namespace {

using avalon::F32Buffer;
using avalon::F32Result;
using avalon::HorizontalSum;
using avalon::kLanes;
using avalon::Load;
using avalon::PooledBinding;
using avalon::Splat;
using avalon::Store;
using avalon::Vec;

constexpr int64_t kRowsPerPart = 64;

// sum_j a[j] b[j] over a row of d (whole vectors, then the tail).
inline float Dot(const float* a, const float* b, int64_t d) {
  const int64_t whole = d / kLanes * kLanes;
  Vec acc{};
  for (int64_t j = 0; j < whole; j += kLanes) acc += Load(a + j) * Load(b + j);
  float s = HorizontalSum(acc);
  for (int64_t j = whole; j < d; ++j) s += a[j] * b[j];
  return s;
}

void ForwardRow(const float* x, const float* w, int64_t d, float eps, float* y, float* rstd) {
  const float r = 1.0f / std::sqrt(Dot(x, x, d) / static_cast<float>(d) + eps);
  const int64_t whole = d / kLanes * kLanes;
  const Vec rv = Splat(r);
  for (int64_t j = 0; j < whole; j += kLanes) Store(y + j, Load(w + j) * (Load(x + j) * rv));
  for (int64_t j = whole; j < d; ++j) y[j] = w[j] * (x[j] * r);
  *rstd = r;
}

// dx of one row; dw_part += dy xh.
void BackwardRow(const float* x, const float* w, float r, const float* dy, int64_t d, float* dx,
                 float* dw_part) {
  const int64_t whole = d / kLanes * kLanes;
  const Vec rv = Splat(r);
  Vec acc{};  // sum_j gw_j xh_j
  for (int64_t j = 0; j < whole; j += kLanes) {
    const Vec g = Load(dy + j), xh = Load(x + j) * rv;
    acc += g * Load(w + j) * xh;
    Store(dw_part + j, Load(dw_part + j) + g * xh);
  }
  float s = HorizontalSum(acc);
  for (int64_t j = whole; j < d; ++j) {
    const float xh = x[j] * r;
    s += dy[j] * w[j] * xh;
    dw_part[j] += dy[j] * xh;
  }
  const float mean = s / static_cast<float>(d);
  const Vec mv = Splat(mean);
  for (int64_t j = 0; j < whole; j += kLanes) {
    Store(dx + j, rv * (Load(dy + j) * Load(w + j) - Load(x + j) * rv * mv));
  }
  for (int64_t j = whole; j < d; ++j) dx[j] = r * (dy[j] * w[j] - x[j] * r * mean);
}

ffi::Error Rows(const F32Buffer& x, const F32Buffer& w, int64_t* n, int64_t* d) {
  auto xd = x.dimensions();
  if (xd.size() != 2 || w.element_count() != static_cast<size_t>(xd[1])) {
    return ffi::Error::InvalidArgument("avalon rms_norm: expects x [n, d] and w [d]");
  }
  *n = xd[0], *d = xd[1];
  return ffi::Error::Success();
}

ffi::Error ForwardImpl(ffi::ThreadPool pool, F32Buffer x, F32Buffer w, float eps, F32Result y,
                       F32Result rstd) {
  int64_t n, d;
  ffi::Error ok = Rows(x, w, &n, &d);
  if (ok.failure()) return ok;
  const float *xp = x.typed_data(), *wp = w.typed_data();
  float *yp = y->typed_data(), *rp = rstd->typed_data();
  const int64_t parts = (n + kRowsPerPart - 1) / kRowsPerPart;
  avalon::ParallelFor(pool, parts, [=](int64_t p) {
    for (int64_t r = p * kRowsPerPart; r < n && r < (p + 1) * kRowsPerPart; ++r) {
      ForwardRow(xp + r * d, wp, d, eps, yp + r * d, rp + r);
    }
  });
  return ffi::Error::Success();
}

ffi::Error BackwardImpl(ffi::ThreadPool pool, F32Buffer x, F32Buffer w, F32Buffer rstd,
                        F32Buffer dy, F32Result dx, F32Result dw) {
  int64_t n, d;
  ffi::Error ok = Rows(x, w, &n, &d);
  if (ok.failure()) return ok;
  if (rstd.element_count() != static_cast<size_t>(n) ||
      dy.element_count() != static_cast<size_t>(n * d)) {
    return ffi::Error::InvalidArgument("avalon rms_norm: rstd must be [n] and dy [n, d]");
  }
  const float *xp = x.typed_data(), *wp = w.typed_data(), *rp = rstd.typed_data();
  const float* gp = dy.typed_data();
  float *dxp = dx->typed_data(), *dwp = dw->typed_data();
  const int64_t parts = (n + kRowsPerPart - 1) / kRowsPerPart;
  std::vector<float> partial(parts * d, 0.0f);
  float* pp = partial.data();
  avalon::ParallelFor(pool, parts, [=](int64_t p) {
    for (int64_t r = p * kRowsPerPart; r < n && r < (p + 1) * kRowsPerPart; ++r) {
      BackwardRow(xp + r * d, wp, rp[r], gp + r * d, d, dxp + r * d, pp + p * d);
    }
  });
  std::memset(dwp, 0, d * sizeof(float));
  for (int64_t p = 0; p < parts; ++p) {
    for (int64_t j = 0; j < d; ++j) dwp[j] += pp[p * d + j];
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonRmsNormForward, ForwardImpl,
                              PooledBinding()
                                  .Arg<F32Buffer>().Arg<F32Buffer>()
                                  .Attr<float>("eps")
                                  .Ret<F32Buffer>().Ret<F32Buffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonRmsNormBackward, BackwardImpl,
                              PooledBinding()
                                  .Arg<F32Buffer>().Arg<F32Buffer>().Arg<F32Buffer>()
                                  .Arg<F32Buffer>()
                                  .Ret<F32Buffer>().Ret<F32Buffer>());
