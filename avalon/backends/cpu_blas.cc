// fp32 products for the update step on CPU through an installed BLAS (Intel MKL's cblas_sgemm),
// as an XLA FFI handler (loaded by cpu_blas.py).
//
// Why: XLA:CPU runs the update step's fp32 products at 130-139 GFLOP/s on one core here, and
// the LM head's [1,024, 576] x [576, 49,152] at ~100, where MKL runs every one of the step's
// shapes and orientations at 151-165 (docs/results_history.md, SmolLM2's update step with
// products on MKL); the products are
// two thirds of SmolLM2-135M's update step. A GEMM written here reached 146-152 on contiguous
// operands and less on transposed ones, so the kernel calls the library rather than imitate it.
//
//   AvalonBlasInit(path): dlopen the library at `path` (MKL's single dynamic library), set its
//     threading to sequential (the work is split over XLA's intra-op threads here instead, so
//     two thread pools never share the cores), find cblas_sgemm. 0 on success.
//   avalon_blas_matmul(a, b) -> c [M, N], attrs transpose_a, transpose_b:
//     a [M, K] (or [K, M] when transpose_a), b [K, N] (or [N, K] when transpose_b).

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu_ffi.h"
#include "cpu_parallel.h"

namespace {

using avalon::F32Buffer;
using avalon::F32Result;
using avalon::PooledBinding;

// cblas_sgemm(layout, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), LP64.
typedef void (*SgemmFn)(int, int, int, int, int, int, float, const float*, int, const float*,
                        int, float, float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
constexpr int kThreadingSequential = 1;  // MKL_THREADING_SEQUENTIAL
SgemmFn sgemm = nullptr;

// Columns per part at least, and work per part at least (~1 ms on one core): a hand-over to
// another thread costs microseconds.
constexpr int64_t kMinColumns = 64;
constexpr double kMinFlopsPerPart = 1e8;

ffi::Error MatmulImpl(ffi::ThreadPool pool, F32Buffer a, F32Buffer b, bool transpose_a,
                      bool transpose_b, F32Result c) {
  if (sgemm == nullptr) {
    return ffi::Error::Internal("avalon_blas_matmul: the BLAS library is not loaded");
  }
  auto ad = a.dimensions();
  auto bd = b.dimensions();
  auto cd = c->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || cd.size() != 2) {
    return ffi::Error::InvalidArgument("avalon_blas_matmul: a, b and c must be 2-D");
  }
  const int64_t M = transpose_a ? ad[1] : ad[0], K = transpose_a ? ad[0] : ad[1];
  const int64_t N = transpose_b ? bd[0] : bd[1], Kb = transpose_b ? bd[1] : bd[0];
  if (K != Kb || cd[0] != M || cd[1] != N) {
    return ffi::Error::InvalidArgument("avalon_blas_matmul: a, b and c do not make a product");
  }
  const int64_t limit = 2147483647;  // LP64: every dimension and stride is an int
  if (M > limit || N > limit || K > limit) {
    return ffi::Error::InvalidArgument("avalon_blas_matmul: a dimension exceeds 2^31 - 1");
  }
  float* cp = c->typed_data();
  if (M == 0 || N == 0) return ffi::Error::Success();
  if (K == 0) {
    std::memset(cp, 0, M * N * sizeof(float));
    return ffi::Error::Success();
  }
  const float *ap = a.typed_data(), *bp = b.typed_data();
  const int lda = static_cast<int>(ad[1]), ldb = static_cast<int>(bd[1]);
  int64_t parts = std::min<int64_t>(pool.num_threads(), N / kMinColumns);
  parts = std::min<int64_t>(parts, static_cast<int64_t>(2.0 * M * N * K / kMinFlopsPerPart));
  parts = std::max<int64_t>(parts, 1);
  // Part p computes columns [n0, n1) of C: the same rows of A, those columns of B.
  avalon::ParallelFor(pool, parts, [=](int64_t p) {
    const int64_t n0 = N * p / parts, n1 = N * (p + 1) / parts;
    const float* bcols = transpose_b ? bp + n0 * ldb : bp + n0;
    sgemm(kRowMajor, transpose_a ? kTrans : kNoTrans, transpose_b ? kTrans : kNoTrans,
          static_cast<int>(M), static_cast<int>(n1 - n0), static_cast<int>(K), 1.0f, ap, lda,
          bcols, ldb, 0.0f, cp + n0, static_cast<int>(N));
  });
  return ffi::Error::Success();
}

}  // namespace

extern "C" int AvalonBlasInit(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return 1;
  // Before any other call into MKL: its threading layer is fixed by the first call.
  auto threading = reinterpret_cast<int (*)(int)>(dlsym(lib, "MKL_Set_Threading_Layer"));
  if (threading != nullptr) threading(kThreadingSequential);
  sgemm = reinterpret_cast<SgemmFn>(dlsym(lib, "cblas_sgemm"));
  return sgemm == nullptr ? 2 : 0;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonBlasMatmul, MatmulImpl,
                              PooledBinding()
                                  .Arg<F32Buffer>().Arg<F32Buffer>()
                                  .Attr<bool>("transpose_a").Attr<bool>("transpose_b")
                                  .Ret<F32Buffer>());
