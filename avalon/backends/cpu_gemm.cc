// Products with few token rows on CPU, as XLA FFI handlers (built by cpu_gemm.py).
//
// Why: in decode every weight is read once per step for a handful of rows, so a product's speed
// is how fast it streams the weight from memory. XLA:CPU's 8-row product streams a cold weight at
// ~6 GB/s where a plain read runs at ~28 (issue 22, RESULTS.md); these loops read the weight in
// one pass, in the order it is stored, and run 2.3-2.5x faster at 8 rows (1.3-1.9x at 1 row, 1.1x
// at 64, level at 512; experiments/bench/cpu_gemm.py).
//
// Layout ("packed"): a weight w [K, O] is stored as p [O / B, K, B] (B = 32 columns, O padded up
// to a multiple of B with zero columns): block b holds columns [b B, (b + 1) B) of every row k
// contiguously, so a block is one sequential read of K * B floats, and one block's K x B slice
// (32 KB at K = 256) stays in L1/L2 while every group of rows passes over it.
//
//   avalon_rows_product(x [n, K], p [nb, K, B]) -> y [n, O]
//   avalon_grouped_rows_product(x [r, K], expert [r] int32, p [E, nb, K, B]) -> y [r, O]
//     rows sorted so each expert's rows are one run; row i uses expert expert[i]'s weight; a row
//     whose expert is outside [0, E) gets zeros (padding).
//
// fp32 only; accumulation is fp32 in k order per output (a different order from XLA's dot, so
// results agree to rounding, not bit for bit).

#include <cstdint>
#include <cstring>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float Vec __attribute__((vector_size(64)));  // 16 floats; the compiler picks registers
constexpr int64_t kBlock = 32;                       // columns per packed block: two Vecs

// Rows [0, N) of x (row stride K) times block b of the packed weight, into y (row stride O),
// columns [b B, b B + width).
template <int N>
inline void RowsTimesBlock(const float* x, const float* block, float* y, int64_t K, int64_t O,
                           int64_t col, int64_t width) {
  Vec lo[N], hi[N];
  for (int n = 0; n < N; ++n) {
    lo[n] = Vec{};
    hi[n] = Vec{};
  }
  for (int64_t k = 0; k < K; ++k) {
    Vec w0, w1;
    std::memcpy(&w0, block + k * kBlock, sizeof(Vec));
    std::memcpy(&w1, block + k * kBlock + 16, sizeof(Vec));
    for (int n = 0; n < N; ++n) {
      const float xv = x[n * K + k];
      lo[n] += xv * w0;
      hi[n] += xv * w1;
    }
  }
  for (int n = 0; n < N; ++n) {
    float* out = y + n * O + col;
    if (width == kBlock) {
      std::memcpy(out, &lo[n], sizeof(Vec));
      std::memcpy(out + 16, &hi[n], sizeof(Vec));
    } else {  // the last, partial block: only the weight's real columns
      float tmp[kBlock];
      std::memcpy(tmp, &lo[n], sizeof(Vec));
      std::memcpy(tmp + 16, &hi[n], sizeof(Vec));
      std::memcpy(out, tmp, width * sizeof(float));
    }
  }
}

// y[rows] = x[rows] @ w for `rows` consecutive rows, w packed [nb, K, B], y row stride O.
void RowsProduct(const float* x, int64_t rows, const float* packed, int64_t nb, float* y,
                 int64_t K, int64_t O) {
  for (int64_t b = 0; b < nb; ++b) {
    const float* block = packed + b * K * kBlock;
    const int64_t col = b * kBlock;
    const int64_t width = O - col < kBlock ? O - col : kBlock;
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) RowsTimesBlock<8>(x + r * K, block, y + r * O, K, O, col, width);
    for (; r + 4 <= rows; r += 4) RowsTimesBlock<4>(x + r * K, block, y + r * O, K, O, col, width);
    for (; r + 2 <= rows; r += 2) RowsTimesBlock<2>(x + r * K, block, y + r * O, K, O, col, width);
    for (; r < rows; ++r) RowsTimesBlock<1>(x + r * K, block, y + r * O, K, O, col, width);
  }
}

ffi::Error CheckPacked(int64_t K, int64_t O, int64_t nb, int64_t block, int64_t pk) {
  if (block != kBlock || pk != K || nb * kBlock < O || (nb - 1) * kBlock >= O) {
    return ffi::Error::InvalidArgument("avalon cpu_gemm: packed weight does not match x / y");
  }
  return ffi::Error::Success();
}

ffi::Error RowsProductImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> packed,
                           ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  auto yd = y->dimensions();
  if (xd.size() != 2 || pd.size() != 3 || yd.size() != 2 || yd[0] != xd[0]) {
    return ffi::Error::InvalidArgument("avalon_rows_product: expects x [n, K], p [nb, K, B]");
  }
  const int64_t K = xd[1], O = yd[1];
  ffi::Error ok = CheckPacked(K, O, pd[0], pd[2], pd[1]);
  if (ok.failure()) return ok;
  RowsProduct(x.typed_data(), xd[0], packed.typed_data(), pd[0], y->typed_data(), K, O);
  return ffi::Error::Success();
}

ffi::Error GroupedRowsProductImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> expert,
                                  ffi::Buffer<ffi::F32> packed, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  auto yd = y->dimensions();
  if (xd.size() != 2 || pd.size() != 4 || yd.size() != 2 || yd[0] != xd[0] ||
      expert.element_count() != static_cast<size_t>(xd[0])) {
    return ffi::Error::InvalidArgument(
        "avalon_grouped_rows_product: expects x [r, K], expert [r], p [E, nb, K, B]");
  }
  const int64_t R = xd[0], K = xd[1], O = yd[1], E = pd[0], nb = pd[1];
  ffi::Error ok = CheckPacked(K, O, nb, pd[3], pd[2]);
  if (ok.failure()) return ok;
  const float* xp = x.typed_data();
  const int32_t* ep = expert.typed_data();
  const float* pp = packed.typed_data();
  float* yp = y->typed_data();
  int64_t start = 0;
  while (start < R) {
    const int32_t e = ep[start];
    int64_t end = start + 1;
    while (end < R && ep[end] == e) ++end;
    if (e >= 0 && e < E) {
      RowsProduct(xp + start * K, end - start, pp + e * nb * K * kBlock, nb, yp + start * O, K, O);
    } else {
      std::memset(yp + start * O, 0, (end - start) * O * sizeof(float));
    }
    start = end;
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonRowsProduct, RowsProductImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonGroupedRowsProduct, GroupedRowsProductImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
