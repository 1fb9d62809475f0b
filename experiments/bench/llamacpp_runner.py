"""llama.cpp as a peer: batched greedy decoding through its C API (`llama-cpp-python`'s ctypes
bindings), one sequence per slot, and writing the GGUF files it reads.

    runner = LlamaCpp(path, slots=8, threads=1, kv_type="f32")
    tokens, prefill_s, decode_s, prefill_cpu_s = runner.generate(prompts, new_tokens=128)
    runner.close()

`generate` clears the KV memory, absorbs every prompt in one `llama_decode` (sequence s in
slot s, logits only at each prompt's last position), then runs one `llama_decode` per new token
over all slots (token t of sequence s at position len(prompt) + t). Greedy = the argmax of
`llama_get_logits` ([slots, vocab] fp32, as llama.cpp's greedy sampler takes it; the first
index wins a tie, as numpy's). It returns the tokens and the seconds of each phase (prefill
with the first token's logits; the decode steps), so a decode rate leaves the prompt out.

`write_dequantised(src, dst, qtype)` rewrites a GGUF file with every tensor dequantised by the
`gguf` package and stored as F32, F16 or BF16 (1-D tensors, the norms, stay F32 as llama.cpp's
converter keeps them), every metadata field copied but the file type: the same weights as the
source at a chosen precision.

The bindings are imported only here, so a machine without `llama-cpp-python` (it builds from
source) can run everything else; `available()` says whether it is installed.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import time
from pathlib import Path

import numpy as np

# llama.cpp's KV cache element types (enum ggml_type).
KV_TYPES = {"f32": 0, "f16": 1, "bf16": 30}
# gguf's LlamaFileType for a whole file of one precision (general.file_type).
_FILE_TYPES = {"F32": 0, "F16": 1, "BF16": 32}
_GGML_TYPES = {"F32": 0, "F16": 1, "BF16": 30}
# Dequantise this many bytes of a source tensor at a time (the `gguf` package's temporaries are
# a few times its output).
_CHUNK_BYTES = 16 << 20


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


# ---- writing the same weights at another precision ------------------------------------------
def _dequantised_rows(tensor) -> np.ndarray:
    """float32 values of a reader tensor, in the file's row order (numpy shape = ggml dims
    reversed)."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    raw = tensor.data
    if tensor.tensor_type == T.F32:
        return np.array(raw, dtype=np.float32)
    if raw.ndim < 2:
        return np.asarray(dequantize(np.asarray(raw), tensor.tensor_type), np.float32)
    first = np.asarray(dequantize(np.asarray(raw[:1]), tensor.tensor_type), np.float32)
    out = np.empty((raw.shape[0], *first.shape[1:]), np.float32)
    step = max(1, _CHUNK_BYTES // max(first.nbytes, 1))
    for lo in range(0, raw.shape[0], step):
        out[lo:lo + step] = dequantize(np.asarray(raw[lo:lo + step]), tensor.tensor_type)
    return out


def _encode(values: np.ndarray, qtype: str):
    """(array to write, its GGML type) for float32 `values` stored as `qtype`."""
    from gguf import GGMLQuantizationType as T

    if qtype == "F32" or values.ndim < 2:
        return values, T.F32
    if qtype == "F16":
        return values.astype(np.float16), T.F16
    return to_bf16_bits(values), T.BF16


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest, ties to even (as
    ggml's and JAX's conversions; the values here are finite)."""
    u = np.ascontiguousarray(values, np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def write_dequantised(src: str | os.PathLike, dst: str | os.PathLike, qtype: str) -> None:
    """`src` (any GGUF the `gguf` package dequantises) rewritten at `dst` with every tensor as
    `qtype` (F32, F16 or BF16; 1-D tensors F32). Written to a temporary name, then renamed."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

    if qtype not in _FILE_TYPES:
        raise ValueError(f"write_dequantised: qtype={qtype!r} must be one of {list(_FILE_TYPES)}")
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tmp = Path(f"{dst}.partial")
    writer = GGUFWriter(tmp, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer's own header fields
        if name == "general.file_type":
            writer.add_file_type(_FILE_TYPES[qtype])
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub)
    # The tensor table first (shapes, types and sizes, known without reading any data), then
    # the data one tensor at a time, so at most one dequantised tensor is held.
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # numpy order
        kept = qtype if len(shape) > 1 else "F32"
        nbytes = int(np.prod(shape)) * (4 if kept == "F32" else 2)
        writer.add_tensor_info(t.name, shape, np.dtype(np.float32 if kept == "F32" else
                                                       np.float16 if kept == "F16" else
                                                       np.uint16), nbytes,
                               raw_dtype=GGMLQuantizationType(_GGML_TYPES[kept]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        arr, _ = _encode(_dequantised_rows(t), qtype)
        writer.write_tensor_data(arr)
    writer.close()
    os.replace(tmp, dst)


def weight_bytes(path: str | os.PathLike) -> int:
    """Bytes of every tensor in a GGUF file: what one decode step reads (the tied embedding is
    the LM head, read whole)."""
    from gguf import GGUFReader

    return int(sum(t.n_bytes for t in GGUFReader(path).tensors))


# ---- batched greedy decoding ------------------------------------------------------------------
_LOGS: list[str] = []


def _quiet():
    """Route llama.cpp's log lines into `_LOGS` (the bindings print them all by default)."""
    import llama_cpp

    @llama_cpp.llama_log_callback
    def keep(level, text, user_data):
        _LOGS.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
    return keep  # the caller keeps the callback alive


class LlamaCpp:
    """One model and one context of `slots` sequences (see the module doc)."""

    _log_callback = None

    def __init__(self, path: str | os.PathLike, *, slots: int, threads: int,
                 kv_type: str = "f32", context: int = 256, prefill_tokens: int = 2048,
                 flash_attention: bool | None = None, extra_buffers: bool = True):
        import llama_cpp.llama_cpp as L

        if LlamaCpp._log_callback is None:
            LlamaCpp._log_callback = _quiet()
            L.llama_backend_init()
        self.L = L
        self.slots, self.threads = slots, threads
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = 0
        # The CPU's extra weight buffers (AMX, repacked layouts; quantised types only). The
        # Q4_1 file with them crashes in llama_decode on this project's Sapphire Rapids VM
        # (SIGSEGV; llama-cpp-python 0.3.36), so that run turns them off.
        mparams.use_extra_bufts = extra_buffers
        self.model = L.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}: {''.join(_LOGS[-5:])}")
        cparams = L.llama_context_default_params()
        # Each sequence keeps its own `context` positions (non-unified KV: one stream a slot).
        cparams.n_ctx = context * slots
        cparams.n_batch = max(prefill_tokens, slots)
        cparams.n_ubatch = min(512, cparams.n_batch)
        cparams.n_seq_max = slots
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.type_k = cparams.type_v = KV_TYPES[kv_type]
        cparams.no_perf = True
        if flash_attention is not None:  # else llama.cpp's default (auto: on where supported)
            cparams.flash_attn_type = int(flash_attention)
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context: {''.join(_LOGS[-5:])}")
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(cparams.n_batch, 0, 1)
        self.capacity = cparams.n_batch

    def _fill(self, tokens, positions, seqs, logits) -> None:
        b = self.batch
        n = len(tokens)
        if n > self.capacity:
            raise ValueError(f"LlamaCpp: {n} tokens exceed the batch of {self.capacity}")
        b.n_tokens = n
        for i in range(n):
            b.token[i] = int(tokens[i])
            b.pos[i] = int(positions[i])
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = int(seqs[i])
            b.logits[i] = int(logits[i])

    def _decode(self, rows: int) -> np.ndarray:
        rc = self.L.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}: {''.join(_LOGS[-5:])}")
        ptr = self.L.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.vocab))

    def generate(self, prompts, new_tokens: int, *, logits_out: list | None = None
                 ) -> tuple[np.ndarray, float, float, float]:
        """Greedy `new_tokens` after each prompt (a sequence of 1-D token arrays, rows <= slots,
        lengths may differ) from empty memory. Returns (tokens [rows, new_tokens], prefill
        seconds, decode seconds, prefill process CPU seconds). `logits_out`, if given,
        receives each step's logits [rows, vocab] (a copy)."""
        prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
        rows = len(prompts)
        if rows > self.slots:
            raise ValueError(f"LlamaCpp.generate: {rows} prompts for {self.slots} slots")
        lengths = np.array([len(p) for p in prompts])
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)
        out = np.empty((rows, new_tokens), np.int32)
        t0, c0 = time.perf_counter(), time.process_time()
        self._fill(np.concatenate(prompts), np.concatenate([np.arange(n) for n in lengths]),
                   np.repeat(np.arange(rows), lengths),
                   np.concatenate([np.arange(n) == n - 1 for n in lengths]))
        logits = self._decode(rows)  # one row per sequence, in batch order
        if logits_out is not None:
            logits_out.append(logits.copy())
        out[:, 0] = logits.argmax(axis=1)
        t1, c1 = time.perf_counter(), time.process_time()
        seq_ids = np.arange(rows)
        ones = np.ones(rows, bool)
        for t in range(1, new_tokens):
            self._fill(out[:, t - 1], lengths + t - 1, seq_ids, ones)
            logits = self._decode(rows)
            if logits_out is not None:
                logits_out.append(logits.copy())
            out[:, t] = logits.argmax(axis=1)
        return out, t1 - t0, time.perf_counter() - t1, c1 - c0

    def close(self) -> None:
        if self.ctx:
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ctx)
            self.L.llama_model_free(self.model)
            self.ctx = self.model = None


def logs() -> list[str]:
    """llama.cpp's log lines so far (model load, context, flash attention choice)."""
    return list(_LOGS)
