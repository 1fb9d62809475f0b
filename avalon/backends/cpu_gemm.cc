// Products with few token rows on CPU, as XLA FFI handlers (built by cpu_gemm.py).
//
// Why: in decode every weight is read once per step for a handful of rows, so a product's speed
// is how fast it streams the weight from memory. XLA:CPU's 8-row product streams a cold weight at
// ~6 GB/s where a plain read runs at ~28 (RESULTS.md, "The C++ kernel for the engine's
// products on CPU"); these loops read the weight in
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
// Streaming: one core's loads alone fall short of what memory gives when compute sits
// between them (a development probe, not in RESULTS.md: 8 rows over a 425 MB stream of [576,
// 1536] weights read at ~60% of a plain read), so the passes prefetch the weight ahead of their
// reads, and rows beyond one group share each 8 KB chunk of a block while it is in L1 (the
// stream keeps going while they compute). A product over a large weight is split
// by blocks over XLA's intra-op threads (the calling thread works too), so decode uses every
// core the process may run on.
//
// x and y are fp32; the weight is fp32 or bf16 (widened to fp32 in registers: exact). Products
// and accumulation are fp32 in k order per output (a different order from XLA's dot, so results
// agree to rounding, not bit for bit).

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cpu_ffi.h"
#include "cpu_parallel.h"
#include "cpu_vector.h"

namespace {

using avalon::F32Buffer;
using avalon::F32Result;
using avalon::Load;
using avalon::PooledBinding;
using avalon::S32Buffer;
using avalon::Vec;

constexpr int64_t kBlock = 32;  // columns per packed block: two Vecs

constexpr int64_t kChunk = 64;        // k steps per chunk: 8 KB of an fp32 block, in L1
constexpr int64_t kGroup = 8;         // rows per pass over a chunk (16 accumulator registers)
constexpr int64_t kSet = 32;          // rows whose groups share each chunk while it is in L1
constexpr int64_t kLine = 64;         // bytes per cache line
constexpr int64_t kPrefetch = 2048;   // bytes ahead of a lone group's reads

// The weight's storage: fp32 (`Load`, cpu_vector.h's), or bfloat16 (the high half of an fp32,
// as uint16) widened to fp32 in registers by the overload below, so a bf16 weight streams half
// the bytes and the products stay fp32.
typedef uint16_t Half16 __attribute__((vector_size(32)));  // 16 bf16 values
typedef uint32_t Word16 __attribute__((vector_size(64)));

inline Vec Load(const uint16_t* p) {
  Half16 h;
  std::memcpy(&h, p, sizeof(Half16));
  const Word16 w = __builtin_convertvector(h, Word16) << 16;
  Vec v;
  std::memcpy(&v, &w, sizeof(Vec));
  return v;
}

// Rows [0, N) of x (row stride K) times rows [k0, k1) of one packed block, accumulated into
// acc [N, B] (First: starting from zero). Meanwhile it prefetches `lines` cache lines from pf
// on, spread evenly over its steps (none if pf is null).
template <typename W, int N, bool First>
inline void RowsTimesChunk(const float* x, const W* block, float* acc, int64_t K, int64_t k0,
                           int64_t k1, const char* pf, int64_t lines) {
  Vec lo[N], hi[N];
  for (int n = 0; n < N; ++n) {
    if (First) {
      lo[n] = Vec{};
      hi[n] = Vec{};
    } else {
      std::memcpy(&lo[n], acc + n * kBlock, sizeof(Vec));
      std::memcpy(&hi[n], acc + n * kBlock + 16, sizeof(Vec));
    }
  }
  const int64_t steps = k1 - k0;
  int64_t owed = 0;  // lines * steps-scaled credit: one line each time it passes `steps`
  for (int64_t k = k0; k < k1; ++k) {
    if (pf != nullptr) {
      for (owed += lines; owed >= steps; owed -= steps, pf += kLine) __builtin_prefetch(pf);
    }
    const Vec w0 = Load(block + k * kBlock);
    const Vec w1 = Load(block + k * kBlock + 16);
    for (int n = 0; n < N; ++n) {
      const float xv = x[n * K + k];
      lo[n] += xv * w0;
      hi[n] += xv * w1;
    }
  }
  for (int n = 0; n < N; ++n) {
    std::memcpy(acc + n * kBlock, &lo[n], sizeof(Vec));
    std::memcpy(acc + n * kBlock + 16, &hi[n], sizeof(Vec));
  }
}

template <typename W, int N>
inline void Pass(const float* x, const W* block, float* acc, int64_t K, int64_t k0, int64_t k1,
                 const char* pf, int64_t lines) {
  if (k0 == 0) {
    RowsTimesChunk<W, N, true>(x, block, acc, K, k0, k1, pf, lines);
  } else {
    RowsTimesChunk<W, N, false>(x, block, acc, K, k0, k1, pf, lines);
  }
}

// One group of n <= kGroup rows over a chunk.
template <typename W>
inline void GroupPass(int64_t n, const float* x, const W* block, float* acc, int64_t K,
                      int64_t k0, int64_t k1, const char* pf, int64_t lines) {
  switch (n) {
    case 8: return Pass<W, 8>(x, block, acc, K, k0, k1, pf, lines);
    case 7: return Pass<W, 7>(x, block, acc, K, k0, k1, pf, lines);
    case 6: return Pass<W, 6>(x, block, acc, K, k0, k1, pf, lines);
    case 5: return Pass<W, 5>(x, block, acc, K, k0, k1, pf, lines);
    case 4: return Pass<W, 4>(x, block, acc, K, k0, k1, pf, lines);
    case 3: return Pass<W, 3>(x, block, acc, K, k0, k1, pf, lines);
    case 2: return Pass<W, 2>(x, block, acc, K, k0, k1, pf, lines);
    default: return Pass<W, 1>(x, block, acc, K, k0, k1, pf, lines);
  }
}

// y[rows] = x[rows] @ w for `rows` consecutive rows, over blocks [b0, b1) of w packed
// [nb, K, B] (y row stride O); acc is scratch of rows x B floats.
//
// The weight is streamed from memory once, in storage order: each block is cut into chunks of
// kChunk k steps, and every group of up to kGroup rows passes over a chunk while it is in L1
// (accumulators kept in acc between chunks). The loads of one core fall short of what memory
// gives when the stream waits on them (see the file's head), so each pass prefetches: a lone group
// kPrefetch bytes ahead of its reads, several groups each their share of the next chunk
// spread over their steps, so the stream keeps going while the groups compute.
template <typename W>
void RowsProduct(const float* x, int64_t rows, const W* packed, int64_t nb, int64_t b0,
                 int64_t b1, float* y, int64_t K, int64_t O, float* acc) {
  const char* end = reinterpret_cast<const char*>(packed + nb * K * kBlock);
  constexpr int64_t kStepBytes = kBlock * static_cast<int64_t>(sizeof(W));
  for (int64_t b = b0; b < b1; ++b) {
    const W* block = packed + b * K * kBlock;
    // Rows in sets of up to kSet: a set's groups pass over each chunk in turn (the x rows they
    // read, kSet x kChunk floats, stay in L1 beside it). Only the first set reads the block
    // from memory and prefetches; later sets (prefill) find it in L2.
    for (int64_t s0 = 0; s0 < rows; s0 += kSet) {
      const int64_t set = rows - s0 < kSet ? rows - s0 : kSet;
      const int64_t groups = (set + kGroup - 1) / kGroup;
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t k1 = k0 + kChunk < K ? k0 + kChunk : K;
        const char* here = reinterpret_cast<const char*>(block + k0 * kBlock);
        const int64_t chunk_lines = (k1 - k0) * kStepBytes / kLine;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t r = s0 + g * kGroup;
          const int64_t n = set - g * kGroup < kGroup ? set - g * kGroup : kGroup;
          // A lone group: the lines kPrefetch bytes ahead of its own. Several: group g takes
          // lines [g, g + 1) / groups of the next chunk (or the next block's first).
          const int64_t share = groups == 1 ? chunk_lines : chunk_lines / groups;
          const char* pf = groups == 1 ? here + kPrefetch
                                       : here + (k1 - k0) * kStepBytes + g * share * kLine;
          GroupPass<W>(n, x + r * K, block, acc + r * kBlock, K, k0, k1,
                       s0 == 0 && pf < end ? pf : nullptr, share);
        }
      }
    }
    const int64_t col = b * kBlock;
    const int64_t width = O - col < kBlock ? O - col : kBlock;
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(y + r * O + col, acc + r * kBlock, width * sizeof(float));
    }
  }
}

// How many parts (threads) a product of this size is split into: XLA's intra-op threads, at
// most one per block, and one unless the weight is large enough that handing work over
// (microseconds) is a small share of streaming it.
int64_t Parts(ffi::ThreadPool& pool, int64_t nb, int64_t K, int64_t experts, int64_t item) {
  constexpr int64_t kMinBytesPerPart = 256 << 10;
  const int64_t threads = pool.num_threads();
  const int64_t bytes = experts * nb * K * kBlock * item;
  int64_t parts = threads < nb ? threads : nb;
  if (parts > bytes / kMinBytesPerPart) parts = bytes / kMinBytesPerPart;
  return parts < 1 ? 1 : parts;
}

// Blocks [b0, b1) of part p of `parts` over nb blocks.
inline void PartBlocks(int64_t p, int64_t parts, int64_t nb, int64_t* b0, int64_t* b1) {
  *b0 = nb * p / parts;
  *b1 = nb * (p + 1) / parts;
}

ffi::Error CheckPacked(int64_t K, int64_t O, int64_t nb, int64_t block, int64_t pk) {
  if (block != kBlock || pk != K || nb * kBlock < O || (nb - 1) * kBlock >= O) {
    return ffi::Error::InvalidArgument("avalon cpu_gemm: packed weight does not match x / y");
  }
  return ffi::Error::Success();
}

template <ffi::DataType T>
ffi::Error RowsProductImpl(ffi::ThreadPool pool, F32Buffer x, ffi::Buffer<T> packed, F32Result y) {
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  auto yd = y->dimensions();
  if (xd.size() != 2 || pd.size() != 3 || yd.size() != 2 || yd[0] != xd[0]) {
    return ffi::Error::InvalidArgument("avalon_rows_product: expects x [n, K], p [nb, K, B]");
  }
  const int64_t rows = xd[0], K = xd[1], O = yd[1], nb = pd[0];
  ffi::Error ok = CheckPacked(K, O, nb, pd[2], pd[1]);
  if (ok.failure()) return ok;
  const float* xp = x.typed_data();
  const auto* pp = packed.typed_data();
  float* yp = y->typed_data();
  const int64_t parts = Parts(pool, nb, K, 1, sizeof(*pp));
  avalon::ParallelFor(pool, parts, [=](int64_t p) {
    int64_t b0, b1;
    PartBlocks(p, parts, nb, &b0, &b1);
    std::vector<float> acc(rows * kBlock);
    RowsProduct(xp, rows, pp, nb, b0, b1, yp, K, O, acc.data());
  });
  return ffi::Error::Success();
}

template <ffi::DataType T>
ffi::Error GroupedRowsProductImpl(ffi::ThreadPool pool, F32Buffer x, S32Buffer expert,
                                  ffi::Buffer<T> packed, F32Result y) {
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
  const auto* pp = packed.typed_data();
  float* yp = y->typed_data();
  // Each part takes the same blocks of every expert's weight, for each run of rows.
  const int64_t parts = Parts(pool, nb, K, E, sizeof(*pp));
  avalon::ParallelFor(pool, parts, [=](int64_t p) {
    int64_t b0, b1;
    PartBlocks(p, parts, nb, &b0, &b1);
    std::vector<float> acc;
    int64_t start = 0;
    while (start < R) {
      const int32_t e = ep[start];
      int64_t end = start + 1;
      while (end < R && ep[end] == e) ++end;
      if (e >= 0 && e < E) {
        acc.resize((end - start) * kBlock);
        RowsProduct(xp + start * K, end - start, pp + e * nb * K * kBlock, nb, b0, b1,
                    yp + start * O, K, O, acc.data());
      } else {
        for (int64_t r = start; r < end; ++r) {
          const int64_t c0 = b0 * kBlock, c1 = b1 * kBlock < O ? b1 * kBlock : O;
          std::memset(yp + r * O + c0, 0, (c1 - c0) * sizeof(float));
        }
      }
      start = end;
    }
  });
  return ffi::Error::Success();
}

}  // namespace

// fp32 x with an fp32 or a bf16 packed weight; y fp32.
#define AVALON_ROWS(NAME, T)                                                                 \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, RowsProductImpl<T>,                                    \
                                PooledBinding()                                              \
                                    .Arg<F32Buffer>().Arg<ffi::Buffer<T>>()                  \
                                    .Ret<F32Buffer>());
#define AVALON_GROUPED(NAME, T)                                                              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, GroupedRowsProductImpl<T>,                             \
                                PooledBinding()                                              \
                                    .Arg<F32Buffer>().Arg<S32Buffer>().Arg<ffi::Buffer<T>>() \
                                    .Ret<F32Buffer>());

AVALON_ROWS(AvalonRowsProduct, ffi::F32)
AVALON_ROWS(AvalonRowsProductBf16, ffi::BF16)
AVALON_GROUPED(AvalonGroupedRowsProduct, ffi::F32)
AVALON_GROUPED(AvalonGroupedRowsProductBf16, ffi::BF16)
