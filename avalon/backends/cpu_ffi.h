// The XLA FFI binding the kernels beside this file share.
//
// A kernel exports each handler as a C symbol (the name its cpu_*.py hands cpu_build.register)
// with XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, Impl, binding). Impl takes, in this order: XLA's
// intra-op thread pool where it splits its work (cpu_parallel.h), its argument buffers and
// attributes as the Python side passes them, then its result buffers; the binding names the
// same in the same order, starting from PooledBinding() (from ffi::Ffi::Bind() for a handler
// that runs on the calling thread alone):
//
//   ffi::Error ForwardImpl(ffi::ThreadPool pool, F32Buffer x, float eps, F32Result y);
//   XLA_FFI_DEFINE_HANDLER_SYMBOL(AvalonNormForward, ForwardImpl,
//       PooledBinding().Arg<F32Buffer>().Attr<float>("eps").Ret<F32Buffer>());
//
// (A result is bound by its buffer type, `Ret<F32Buffer>`, and taken as `F32Result`.)
#ifndef AVALON_BACKENDS_CPU_FFI_H_
#define AVALON_BACKENDS_CPU_FFI_H_

#include "xla/ffi/api/ffi.h"

// Every kernel spells XLA's FFI types through this alias, handlers included (they are defined
// at file scope), so it lives here once.
namespace ffi = xla::ffi;

namespace avalon {

using F32Buffer = ffi::Buffer<ffi::F32>;        // an fp32 argument, of any shape
using S32Buffer = ffi::Buffer<ffi::S32>;        // an int32 argument (targets, segments, experts)
using F32Result = ffi::ResultBuffer<ffi::F32>;  // an fp32 result, which the handler writes

// The binding of a handler that splits its work over XLA's intra-op threads: the pool first.
inline auto PooledBinding() { return ffi::Ffi::Bind().Ctx<ffi::ThreadPool>(); }

}  // namespace avalon

#endif  // AVALON_BACKENDS_CPU_FFI_H_
