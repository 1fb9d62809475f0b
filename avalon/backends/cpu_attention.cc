// Causal, same-segment attention for training on CPU, forward and backward, as XLA FFI handlers
// (built by cpu_attention.py).
//
// Why: XLA:CPU runs the model's block attention (`model.attention._flash_attention`) as separate
// passes over every [rows, keys] block: the product, the mask, the row max and sum (each a
// reduce-window tree), the exponentials, the sliced copies of K and V. At SmolLM2's shapes the
// attention core ran at ~35 GFLOP/s where the products around it run at ~130 (a profile of
// one update step, docs/results_history.md, "Where SmolLM2's update step goes (one core)"). Here each block of scores is made, masked, exponentiated and
// used while it is in L1, in one pass, as torch's CPU flash attention does.
//
// Layout (the model's `_flash_core`): q [b, h, t*g, d], row m is query m / g of query head
// (kv head, m % g); k, v [b, h, t, d]; seg [b, t] int32. Query i sees key j iff j <= i and
// seg[i] == seg[j]. scale multiplies q.k.
//
//   avalon_attention_fwd(q, k, v, seg) -> out [b, h, t*g, d], lse [b, h, t*g]
//   avalon_attention_bwd(q, k, v, seg, out, lse, dout) -> dq, dk, dv
//
// Forward: per block of query rows, the key blocks up to its last query in turn, with the
// running max and sum of each row (online softmax); lse = max + log(sum) is kept for the
// backward, which recomputes each block's probabilities from it (FlashAttention's backward):
// dV += P^T dO, dP = dO V^T, dS = P (dP - D) scale with D = rowsum(dO * O), dQ += dS K,
// dK += dS^T Q. All fp32; d a multiple of 16 (cpu_attention.py keeps the model's own path
// otherwise).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_ffi.h"
#include "cpu_parallel.h"
#include "cpu_vector.h"

namespace {

using avalon::Exp;
using avalon::F32Buffer;
using avalon::F32Result;
using avalon::HorizontalMax;
using avalon::HorizontalSum;
using avalon::IVec;
using avalon::kLanes;
using avalon::Load;
using avalon::LoadI;
using avalon::PooledBinding;
using avalon::S32Buffer;
using avalon::Splat;
using avalon::Store;
using avalon::Vec;
constexpr int64_t kKeys = 64;       // keys per block: the scores' row is four Vecs
constexpr int64_t kQueries = 32;    // queries per block of rows (times g rows)
constexpr float kNegInf = -INFINITY;

// C[m, :N] (+)= sum_k A(m, k) B[k, :N] for rows [0, MR), N = NV * 16: A(m, k) is
// a[m * am + k * ak] (any strides, so a transposed A costs nothing), B row-major with row stride
// ldb, C row stride ldc. MR x NV accumulators stay in registers over the whole k loop.
template <int MR, int NV>
inline void Tile(int64_t K, const float* a, int64_t am, int64_t ak, const float* b, int64_t ldb,
                 float* c, int64_t ldc, bool accumulate) {
  Vec acc[MR][NV];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NV; ++j) acc[i][j] = accumulate ? Load(c + i * ldc + j * kLanes) : Vec{};
  }
  for (int64_t k = 0; k < K; ++k) {
    Vec bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = Load(b + k * ldb + j * kLanes);
    for (int i = 0; i < MR; ++i) {
      const Vec ai = Splat(a[i * am + k * ak]);
      for (int j = 0; j < NV; ++j) acc[i][j] += ai * bv[j];
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NV; ++j) Store(c + i * ldc + j * kLanes, acc[i][j]);
  }
}

// Rows per tile for NV vectors of columns: as many accumulators as leave registers for B.
template <int NV>
constexpr int RowsPerTile() {
  return NV >= 8 ? 3 : NV >= 4 ? 6 : NV >= 2 ? 12 : 24;
}

template <int NV, int MR>
inline void RowsTail(int64_t rows, int64_t K, const float* a, int64_t am, int64_t ak,
                     const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if constexpr (MR > 0) {
    if (rows == MR) return Tile<MR, NV>(K, a, am, ak, b, ldb, c, ldc, accumulate);
    return RowsTail<NV, MR - 1>(rows, K, a, am, ak, b, ldb, c, ldc, accumulate);
  }
}

// C [M, NV * 16] (+)= A [M, K] B [K, NV * 16] (A by strides, as in Tile).
template <int NV>
void Product(int64_t M, int64_t K, const float* a, int64_t am, int64_t ak, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  constexpr int MR = RowsPerTile<NV>();
  int64_t m = 0;
  for (; m + MR <= M; m += MR) {
    Tile<MR, NV>(K, a + m * am, am, ak, b, ldb, c + m * ldc, ldc, accumulate);
  }
  if (m < M) RowsTail<NV, MR - 1>(M - m, K, a + m * am, am, ak, b, ldb, c + m * ldc, ldc,
                                  accumulate);
}

// Product over d columns (d = NV * 16), dispatched once per call on d.
typedef void (*ProductFn)(int64_t, int64_t, const float*, int64_t, int64_t, const float*,
                          int64_t, float*, int64_t, bool);
ProductFn ProductFor(int64_t d) {
  switch (d / kLanes) {
    case 1: return Product<1>;
    case 2: return Product<2>;
    case 3: return Product<3>;
    case 4: return Product<4>;
    case 5: return Product<5>;
    case 6: return Product<6>;
    case 7: return Product<7>;
    case 8: return Product<8>;
    case 12: return Product<12>;
    case 16: return Product<16>;
    default: return nullptr;
  }
}
constexpr ProductFn kKeyProduct = Product<kKeys / kLanes>;

// One (batch, kv head): its rows, keys and segment ids, and what the passes share.
struct Head {
  const float *q, *k, *v;  // q [t*g, d], k, v [t, d]
  const int32_t* seg;      // [t]
  int64_t t, g, d;
  float scale;
  ProductFn product_d;
  // kt: k transposed per block of kKeys keys, [tp / kKeys, d, kKeys] (keys padded with zeros to
  // tp, a multiple of kKeys, so every block of scores is a whole tile wide). Each block's d rows
  // are contiguous: as one [d, tp] matrix the rows a product reads would be tp floats apart, a
  // multiple of 4 KB at t = 1024, and share one L1 set (the forward ran at 80 GFLOP/s so).
  // run_start[i]: the first key of query i's segment run (seg constant over [run_start[i], i]),
  // which says when a block needs no segment mask.
  std::vector<float> kt;
  std::vector<int32_t> seg_padded;
  std::vector<int64_t> run_start;
  int64_t tp;

  void Prepare(const float* src_t /* k or v */, std::vector<float>* out) const {
    out->assign(d * tp, 0.0f);
    for (int64_t j = 0; j < t; ++j) {
      float* block = out->data() + (j / kKeys) * d * kKeys + j % kKeys;
      for (int64_t c = 0; c < d; ++c) block[c * kKeys] = src_t[j * d + c];
    }
  }
  // Block k0 (a multiple of kKeys) of a Prepare'd k or v: [d, kKeys].
  const float* Transposed(const std::vector<float>& kv_t, int64_t k0) const {
    return kv_t.data() + (k0 / kKeys) * d * kKeys;
  }
  void Init() {
    tp = (t + kKeys - 1) / kKeys * kKeys;
    Prepare(k, &kt);
    seg_padded.assign(tp, 0);
    std::memcpy(seg_padded.data(), seg, t * sizeof(int32_t));
    run_start.resize(t);
    for (int64_t i = 0; i < t; ++i) {
      run_start[i] = (i > 0 && seg[i] == seg[i - 1]) ? run_start[i - 1] : i;
    }
  }
};

// Scores of rows [r0, r0 + R) (queries q0 = r0 / g ..) against keys [k0, k0 + kKeys): s [R,
// kKeys] = scale q.k, masked entries -inf. Returns false if every entry is masked.
bool BlockScores(const Head& h, int64_t q0, int64_t q1, int64_t k0, float* s) {
  const int64_t g = h.g, R = (q1 - q0) * g;
  kKeyProduct(R, h.d, h.q + q0 * g * h.d, h.d, 1, h.Transposed(h.kt, k0), kKeys, s, kKeys,
              false);
  const Vec scale = Splat(h.scale);
  // Every key of the block visible to every query: below the diagonal, one segment run.
  const bool open = k0 + kKeys - 1 <= q0 && h.run_start[q1 - 1] <= k0;
  bool any = open;
  for (int64_t qi = q0; qi < q1; ++qi) {
    const int32_t sq = h.seg[qi];
    for (int64_t r = (qi - q0) * g; r < (qi - q0 + 1) * g; ++r) {
      float* row = s + r * kKeys;
      for (int64_t c = 0; c < kKeys; c += kLanes) {
        Vec x = Load(row + c) * scale;
        if (!open) {
          IVec key = IVec{} + static_cast<int32_t>(k0 + c);
          for (int l = 0; l < kLanes; ++l) key[l] += l;
          const IVec seen = (key <= static_cast<int32_t>(qi)) &
                            (LoadI(h.seg_padded.data() + k0 + c) == sq);
          x = seen ? x : Splat(kNegInf);
          for (int l = 0; l < kLanes; ++l) any |= seen[l] != 0;
        }
        Store(row + c, x);
      }
    }
  }
  return any;
}

// Forward of query rows [q0 * g, q1 * g): out rows and their lse.
void ForwardBlock(const Head& h, int64_t q0, int64_t q1, float* out, float* lse, float* s) {
  const int64_t g = h.g, d = h.d, R = (q1 - q0) * g;
  std::vector<float> m(R, kNegInf), l(R, 0.0f);
  float* o = out + q0 * g * d;
  std::memset(o, 0, R * d * sizeof(float));
  for (int64_t k0 = 0; k0 < q1; k0 += kKeys) {
    if (!BlockScores(h, q0, q1, k0, s)) continue;
    for (int64_t r = 0; r < R; ++r) {
      float* row = s + r * kKeys;
      Vec mx = Load(row);
      for (int64_t c = kLanes; c < kKeys; c += kLanes) {
        const Vec x = Load(row + c);
        mx = x > mx ? x : mx;
      }
      const float m_new = std::fmax(m[r], HorizontalMax(mx));
      if (m_new == kNegInf) continue;  // nothing visible in this block for this row
      const Vec mv = Splat(m_new);
      Vec sum{};
      for (int64_t c = 0; c < kKeys; c += kLanes) {
        const Vec p = Exp(Load(row + c) - mv);
        Store(row + c, p);
        sum += p;
      }
      const float alpha = m[r] == kNegInf ? 0.0f : std::exp(m[r] - m_new);
      l[r] = l[r] * alpha + HorizontalSum(sum);
      m[r] = m_new;
      if (alpha != 1.0f) {
        const Vec av = Splat(alpha);
        for (int64_t c = 0; c < d; c += kLanes) Store(o + r * d + c, Load(o + r * d + c) * av);
      }
    }
    const int64_t kn = (q1 < k0 + kKeys ? q1 : k0 + kKeys) - k0;  // keys that can be seen
    // Rows with nothing visible in this block have stale scores in s; their m is -inf only
    // while nothing was visible before either, so zero those rows' probabilities.
    for (int64_t r = 0; r < R; ++r) {
      if (m[r] == kNegInf) std::memset(s + r * kKeys, 0, kKeys * sizeof(float));
    }
    h.product_d(R, kn, s, kKeys, 1, h.v + k0 * d, d, o, d, true);
  }
  for (int64_t r = 0; r < R; ++r) {
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const Vec iv = Splat(inv);
    for (int64_t c = 0; c < d; c += kLanes) Store(o + r * d + c, Load(o + r * d + c) * iv);
    lse[q0 * g + r] = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
  }
}

void BackwardHead(const Head& h, const float* out, const float* lse, const float* dout,
                  float* dq, float* dk, float* dv) {
  const int64_t g = h.g, d = h.d, t = h.t;
  std::vector<float> vt;
  h.Prepare(h.v, &vt);
  std::vector<float> dk_acc(h.tp * d, 0.0f), dv_acc(h.tp * d, 0.0f);
  std::vector<float> p(kQueries * g * kKeys), ds(kQueries * g * kKeys), drow(kQueries * g);
  std::memset(dq, 0, t * g * d * sizeof(float));
  const Vec scale = Splat(h.scale);
  for (int64_t q0 = 0; q0 < t; q0 += kQueries) {
    const int64_t q1 = q0 + kQueries < t ? q0 + kQueries : t, R = (q1 - q0) * g;
    const float* qb = h.q + q0 * g * d;
    const float* dob = dout + q0 * g * d;
    for (int64_t r = 0; r < R; ++r) {
      Vec acc{};
      for (int64_t c = 0; c < d; c += kLanes) {
        acc += Load(dob + r * d + c) * Load(out + (q0 * g + r) * d + c);
      }
      drow[r] = HorizontalSum(acc);
    }
    for (int64_t k0 = 0; k0 < q1; k0 += kKeys) {
      if (!BlockScores(h, q0, q1, k0, p.data())) continue;
      for (int64_t r = 0; r < R; ++r) {
        const float lr = lse[q0 * g + r];
        float* row = p.data() + r * kKeys;
        if (lr == kNegInf) {
          std::memset(row, 0, kKeys * sizeof(float));
          continue;
        }
        const Vec lv = Splat(lr);
        for (int64_t c = 0; c < kKeys; c += kLanes) Store(row + c, Exp(Load(row + c) - lv));
      }
      const int64_t kn = (q1 < k0 + kKeys ? q1 : k0 + kKeys) - k0;
      // dV[k0 + i] += sum_r P[r, i] dO[r]
      h.product_d(kn, R, p.data(), 1, kKeys, dob, d, dv_acc.data() + k0 * d, d, true);
      // dP = dO V^T (all kKeys columns: V^T is padded)
      kKeyProduct(R, d, dob, d, 1, h.Transposed(vt, k0), kKeys, ds.data(), kKeys, false);
      for (int64_t r = 0; r < R; ++r) {
        const Vec dr = Splat(drow[r]);
        float* prow = p.data() + r * kKeys;
        float* drw = ds.data() + r * kKeys;
        for (int64_t c = 0; c < kKeys; c += kLanes) {
          Store(drw + c, Load(prow + c) * (Load(drw + c) - dr) * scale);
        }
      }
      // dQ[r] += sum_i dS[r, i] K[k0 + i];  dK[k0 + i] += sum_r dS[r, i] Q[r]
      h.product_d(R, kn, ds.data(), kKeys, 1, h.k + k0 * d, d, dq + q0 * g * d, d, true);
      h.product_d(kn, R, ds.data(), 1, kKeys, qb, d, dk_acc.data() + k0 * d, d, true);
    }
  }
  std::memcpy(dk, dk_acc.data(), t * d * sizeof(float));
  std::memcpy(dv, dv_acc.data(), t * d * sizeof(float));
}

ffi::Error Shapes(const F32Buffer& q, const F32Buffer& k, const S32Buffer& seg, int64_t* b,
                  int64_t* nh, int64_t* t, int64_t* g, int64_t* d) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  auto sd = seg.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || sd.size() != 2 || qd[0] != kd[0] || qd[1] != kd[1] ||
      qd[3] != kd[3] || sd[0] != kd[0] || sd[1] != kd[2] || kd[2] == 0 || qd[2] % kd[2] != 0) {
    return ffi::Error::InvalidArgument(
        "avalon attention: expects q [b, h, t*g, d], k and v [b, h, t, d], seg [b, t]");
  }
  *b = kd[0], *nh = kd[1], *t = kd[2], *g = qd[2] / kd[2], *d = kd[3];
  if (ProductFor(*d) == nullptr || *d % kLanes != 0) {
    return ffi::Error::InvalidArgument("avalon attention: head_dim must be a multiple of 16");
  }
  return ffi::Error::Success();
}

Head MakeHead(const float* q, const float* k, const float* v, const int32_t* seg, int64_t bh,
              int64_t nh, int64_t t, int64_t g, int64_t d, float scale) {
  Head h;
  h.q = q + bh * t * g * d;
  h.k = k + bh * t * d;
  h.v = v + bh * t * d;
  h.seg = seg + (bh / nh) * t;
  h.t = t, h.g = g, h.d = d, h.scale = scale;
  h.product_d = ProductFor(d);
  h.Init();
  return h;
}

ffi::Error ForwardImpl(ffi::ThreadPool pool, F32Buffer q, F32Buffer k, F32Buffer v, S32Buffer seg,
                       float scale, F32Result out, F32Result lse) {
  int64_t b, nh, t, g, d;
  ffi::Error ok = Shapes(q, k, seg, &b, &nh, &t, &g, &d);
  if (ok.failure()) return ok;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const int32_t* sp = seg.typed_data();
  float *op = out->typed_data(), *lp = lse->typed_data();
  // One part per (batch, kv head): each prepares its K^T once for all its query blocks.
  avalon::ParallelFor(pool, b * nh, [=](int64_t bh) {
    Head h = MakeHead(qp, kp, vp, sp, bh, nh, t, g, d, scale);
    std::vector<float> s(kQueries * g * kKeys);
    for (int64_t q0 = 0; q0 < t; q0 += kQueries) {
      ForwardBlock(h, q0, q0 + kQueries < t ? q0 + kQueries : t, op + bh * t * g * d,
                   lp + bh * t * g, s.data());
    }
  });
  return ffi::Error::Success();
}

ffi::Error BackwardImpl(ffi::ThreadPool pool, F32Buffer q, F32Buffer k, F32Buffer v, S32Buffer seg,
                        F32Buffer out, F32Buffer lse, F32Buffer dout, float scale, F32Result dq,
                        F32Result dk, F32Result dv) {
  int64_t b, nh, t, g, d;
  ffi::Error ok = Shapes(q, k, seg, &b, &nh, &t, &g, &d);
  if (ok.failure()) return ok;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const float *op = out.typed_data(), *lp = lse.typed_data(), *dop = dout.typed_data();
  const int32_t* sp = seg.typed_data();
  float *dqp = dq->typed_data(), *dkp = dk->typed_data(), *dvp = dv->typed_data();
  avalon::ParallelFor(pool, b * nh, [=](int64_t bh) {
    Head h = MakeHead(qp, kp, vp, sp, bh, nh, t, g, d, scale);
    BackwardHead(h, op + bh * t * g * d, lp + bh * t * g, dop + bh * t * g * d,
                 dqp + bh * t * g * d, dkp + bh * t * d, dvp + bh * t * d);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonAttentionForward, ForwardImpl,
                              PooledBinding()
                                  .Arg<F32Buffer>().Arg<F32Buffer>().Arg<F32Buffer>()
                                  .Arg<S32Buffer>()
                                  .Attr<float>("scale")
                                  .Ret<F32Buffer>().Ret<F32Buffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonAttentionBackward, BackwardImpl,
                              PooledBinding()
                                  .Arg<F32Buffer>().Arg<F32Buffer>().Arg<F32Buffer>()
                                  .Arg<S32Buffer>().Arg<F32Buffer>().Arg<F32Buffer>()
                                  .Arg<F32Buffer>()
                                  .Attr<float>("scale")
                                  .Ret<F32Buffer>().Ret<F32Buffer>().Ret<F32Buffer>());
