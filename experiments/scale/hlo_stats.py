"""Matmul FLOPs and collectives read from a compiled (post-optimisation) HLO module's text.

Why not only `compiled.cost_analysis()`: XLA's cost analysis counts the body of a `while` loop
once, whatever its trip count (measured: a 10-step `lax.scan` of matmuls reports 1/10 of its
FLOPs on TPU). Every model here runs its layers, micro-batches and log-prob chunks as loops, so
the raw number undercounts by orders of magnitude. This module walks the HLO call graph and
multiplies each loop body by its trip count:

- FLOPs are the matmul FLOPs the model accounting counts (2 per multiply-add): `dot`,
  `convolution` (TPU lowers dots to convolutions) and Mosaic custom calls (`ragged_dot` on TPU
  is one; their own `cost_estimate` is used). Elementwise work is not counted, on purpose.
- Collectives: per kind (all-gather, all-reduce, reduce-scatter, all-to-all,
  collective-permute; async `-start` forms folded in), the number executed and the bytes of
  their results, per device.

Trip counts: the JAX lowering of `scan`/`fori_loop` counts an s32 induction variable from 0
and the loop condition compares it `LT` a constant; that constant is the trip count. A backend
config's `known_trip_count` wins when present. A loop whose count cannot be read is reported
in `unknown_trip_loops` and counted once. `conditional` branches (e.g. `lax.switch`) count as
their most expensive branch.
"""

from __future__ import annotations

import dataclasses
import math
import re

_DTYPE_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
                "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "ragged-all-to-all")

_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->\s*(.*)\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_PARAM = re.compile(r"([\w.\-]+):\s*((?:\([^)]*\))|(?:[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?))")


@dataclasses.dataclass
class Instr:
    name: str
    shape: str  # the result type text, e.g. "bf16[256,1024]{1,0}" or "(s32[], f32[2])"
    opcode: str
    operands: list[str]
    attrs: str  # everything after the operand list


@dataclasses.dataclass
class Computation:
    name: str
    instrs: list[Instr]
    shapes: dict[str, str]  # value name -> result type text (parameters and instructions)
    literals: dict[str, int]  # integer scalar constants by name (loop bounds)
    root: str | None = None  # the ROOT instruction's name


def array_dims(shape: str) -> list[tuple[str, list[int]]]:
    """Every array type in a type text: [(dtype, dims)], tuples flattened."""
    out = []
    for dtype, dims in _ARRAY.findall(shape):
        if dtype in _DTYPE_BYTES:
            out.append((dtype, [int(d) for d in dims.split(",") if d]))
    return out


def shape_bytes(shape: str) -> int:
    return sum(_DTYPE_BYTES[dt] * math.prod(dims) for dt, dims in array_dims(shape))


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside brackets of any kind."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return parts


def _parse_rhs(rhs: str) -> tuple[str, str, list[str], str]:
    """'<type> <opcode>(<operands>), <attrs>' -> (type, opcode, operand names, attrs)."""
    depth, i = 0, 0
    # The result type ends at the first space outside brackets.
    while i < len(rhs):
        ch = rhs[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == " " and depth == 0:
            break
        i += 1
    shape, rest = rhs[:i], rhs[i + 1:]
    paren = rest.find("(")
    if paren < 0:
        return shape, rest.strip(), [], ""
    opcode = rest[:paren].strip()
    depth, j = 0, paren
    while j < len(rest):
        if rest[j] == "(":
            depth += 1
        elif rest[j] == ")":
            depth -= 1
            if depth == 0:
                break
        j += 1
    operand_text = rest[paren + 1:j]
    operands = []
    for part in _split_top(operand_text):
        names = re.findall(r"%([\w.\-]+)", part)
        if names:
            operands.append(names[-1])
    return shape, opcode, operands, rest[j + 1:]


def parse_module(text: str) -> tuple[dict[str, Computation], str]:
    """Computations by name, and the name of the entry computation."""
    comps: dict[str, Computation] = {}
    entry = None
    current = None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m:
                current = Computation(m.group(2), [], {}, {})
                for pname, ptype in _PARAM.findall(m.group(3)):
                    current.shapes[pname] = ptype
                if m.group(1):
                    entry = current.name
            continue
        if line.strip() == "}":
            comps[current.name] = current
            current = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        shape, opcode, operands, attrs = _parse_rhs(m.group(3))
        ins = Instr(m.group(2), shape, opcode, operands, attrs)
        current.instrs.append(ins)
        current.shapes[ins.name] = shape
        if m.group(1):
            current.root = ins.name
        lit = re.match(r"constant\((-?[0-9]+)\)", m.group(3).split(" ", 1)[-1].strip())
        if opcode == "constant" and lit and re.match(r"[su](32|64)\[\]", shape):
            current.literals[ins.name] = int(lit.group(1))
    if entry is None:
        raise ValueError("HLO text has no ENTRY computation")
    return comps, entry


def _attr(attrs: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=%?([\w.\-]+)", attrs)
    return m.group(1) if m else None


def _dot_flops(ins: Instr, comp: Computation) -> float:
    out = array_dims(ins.shape)
    lhs = array_dims(comp.shapes.get(ins.operands[0], ""))
    if not out or not lhs:
        return 0.0
    m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins.attrs)
    contract = [int(d) for d in m.group(1).split(",") if d] if m else []
    k = math.prod(lhs[0][1][d] for d in contract)
    return 2.0 * math.prod(out[0][1]) * k


def _conv_flops(ins: Instr, comp: Computation) -> float:
    """2 x output elements x the MACs of each output: input features x the window taps that
    meet a real (not padding, not dilation-hole) input element.

    TPU lowers many dots to convolutions whose "window" only moves over padding: e.g.
    `window={size=48 pad=47_47 rhs_reversal=1}` on a spatial input of size 1 (a head axis of
    48), where each output reads exactly one real element. Per spatial dimension the real taps
    are min(window, ceil(window / lhs_dilate), input size)."""
    out = array_dims(ins.shape)
    lhs = array_dims(comp.shapes.get(ins.operands[0], "")) if ins.operands else []
    rhs = array_dims(comp.shapes.get(ins.operands[1], "")) if len(ins.operands) > 1 else []
    m = re.search(r"dim_labels=([\w]+)_([\w]+)->", ins.attrs)
    if not out or not rhs or not lhs or not m:
        return 0.0
    lhs_labels, rhs_labels = m.group(1), m.group(2)
    dims = rhs[0][1]
    i_pos = rhs_labels.find("i")
    macs = dims[i_pos] if 0 <= i_pos < len(dims) else 1
    win = re.search(r"window=\{size=([0-9x]+)", ins.attrs)
    sizes = [int(v) for v in win.group(1).split("x")] if win else []
    dil = re.search(r"lhs_dilate=([0-9x]+)", ins.attrs)
    dilate = [int(v) for v in dil.group(1).split("x")] if dil else [1] * len(sizes)
    for d, size in enumerate(sizes):
        pos = lhs_labels.find(str(d))
        real = lhs[0][1][pos] if 0 <= pos < len(lhs[0][1]) else size
        macs *= min(size, -(-size // dilate[d]), real)
    return 2.0 * math.prod(out[0][1]) * macs


def _custom_flops(ins: Instr) -> float:
    m = re.search(r'"cost_estimate":\{"flops":"?([0-9.eE+]+)"?', ins.attrs)
    return float(m.group(1)) if m else 0.0


def _trip_count(ins: Instr, comps: dict[str, Computation]) -> int | None:
    m = re.search(r'"known_trip_count":\{"n":"?([0-9]+)"?', ins.attrs)
    if m:
        return int(m.group(1))
    cond = comps.get(_attr(ins.attrs, "condition") or "")
    if cond is None:
        return None
    for ci in cond.instrs:
        if ci.opcode == "compare" and "direction=LT" in ci.attrs:
            for op in ci.operands:
                if op in cond.literals:
                    others = [o for o in ci.operands if o != op]
                    step = _loop_step(ins, comps, cond, others[0] if others else None)
                    return -(-cond.literals[op] // step)
    return None


def _loop_step(ins: Instr, comps: dict[str, Computation], cond: Computation,
               counter: str | None) -> int:
    """How much a loop's body adds to the induction variable the condition compares (1 when
    it cannot be read). XLA's own loops need this: a windowed einsum (the FSDP all-gather
    fused into its matmul) unrolled twice compares `i < 16` and adds 2 per trip, 8 trips."""
    by_name = {i.name: i for i in cond.instrs}
    gte = by_name.get(counter or "")
    m = re.search(r"\bindex=([0-9]+)", gte.attrs) if gte is not None and \
        gte.opcode == "get-tuple-element" else None
    body = comps.get(_attr(ins.attrs, "body") or "")
    if m is None or body is None or body.root is None:
        return 1
    body_by_name = {i.name: i for i in body.instrs}
    root = body_by_name.get(body.root)
    index = int(m.group(1))
    if root is None or root.opcode != "tuple" or index >= len(root.operands):
        return 1
    update = body_by_name.get(root.operands[index])
    if update is None or update.opcode != "add":
        return 1
    steps = [body.literals[o] for o in update.operands if o in body.literals]
    return steps[0] if steps and steps[0] > 0 else 1


@dataclasses.dataclass
class HloStats:
    flops: float
    collectives: dict[str, dict[str, float]]
    unknown_trip_loops: list[str]
    loops: list[tuple[str, int]]

    def as_json(self) -> dict:
        return {"flops": self.flops, "collectives": self.collectives,
                "unknown_trip_loops": self.unknown_trip_loops,
                "loops": [{"name": n, "trips": t} for n, t in self.loops]}


def analyse(text: str) -> HloStats:
    """FLOPs (trip-count weighted) and collectives of one compiled HLO module's text."""
    comps, entry = parse_module(text)
    memo: dict[str, tuple[float, dict]] = {}
    unknown: list[str] = []
    loops: list[tuple[str, int]] = []

    def add(into: dict, other: dict, times: float):
        for kind, v in other.items():
            slot = into.setdefault(kind, {"count": 0.0, "bytes": 0.0})
            slot["count"] += v["count"] * times
            slot["bytes"] += v["bytes"] * times

    def walk(name: str) -> tuple[float, dict]:
        if name in memo:
            return memo[name]
        comp = comps[name]
        flops, coll = 0.0, {}
        for ins in comp.instrs:
            op = ins.opcode
            if op == "dot":
                flops += _dot_flops(ins, comp)
            elif op == "convolution":
                flops += _conv_flops(ins, comp)
            elif op == "custom-call":
                flops += _custom_flops(ins)
            base = op[:-len("-start")] if op.endswith("-start") else op
            if base in COLLECTIVES:
                sizes = [_DTYPE_BYTES[dt] * math.prod(d) for dt, d in array_dims(ins.shape)]
                slot = coll.setdefault(base, {"count": 0.0, "bytes": 0.0})
                slot["count"] += 1
                slot["bytes"] += max(sizes) if sizes else 0
            if op == "while":
                trips = _trip_count(ins, comps)
                if trips is None:
                    unknown.append(ins.name)
                    trips = 1
                loops.append((ins.name, trips))
                f, c = walk(_attr(ins.attrs, "body"))
                flops += trips * f
                add(coll, c, trips)
            elif op == "conditional":
                m = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
                names = re.findall(r"%?([\w.\-]+)", m.group(1)) if m else [
                    _attr(ins.attrs, "true_computation"), _attr(ins.attrs, "false_computation")]
                branches = [walk(n) for n in names if n in comps]
                if branches:
                    f, c = max(branches, key=lambda fc: fc[0])
                    flops += f
                    add(coll, c, 1)
            else:
                for key in ("calls", "to_apply"):
                    callee = _attr(ins.attrs, key)
                    if callee in comps and key == "calls":
                        f, c = walk(callee)
                        flops += f
                        add(coll, c, 1)
        memo[name] = (flops, coll)
        return memo[name]

    flops, coll = walk(entry)
    return HloStats(flops, coll, unknown, loops)


def flops_by_op(text: str, top: int = 15) -> list[tuple[str, float]]:
    """The `top` JAX op names (HLO metadata) by trip-weighted matmul FLOPs: where they go."""
    comps, entry = parse_module(text)
    totals: dict[str, float] = {}

    def visit(name: str, times: float):
        comp = comps[name]
        for ins in comp.instrs:
            f = 0.0
            if ins.opcode == "dot":
                f = _dot_flops(ins, comp)
            elif ins.opcode == "convolution":
                f = _conv_flops(ins, comp)
            elif ins.opcode == "custom-call":
                f = _custom_flops(ins)
            if f:
                m = re.search(r'op_name="([^"]*)"', ins.attrs)
                key = m.group(1) if m else ins.name
                totals[key] = totals.get(key, 0.0) + f * times
            if ins.opcode == "while":
                visit(_attr(ins.attrs, "body"), times * (_trip_count(ins, comps) or 1))
            elif ins.opcode == "conditional":
                m = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
                for n in re.findall(r"%?([\w.\-]+)", m.group(1)) if m else []:
                    if n in comps:
                        visit(n, times)
            else:
                callee = _attr(ins.attrs, "calls")
                if callee in comps:
                    visit(callee, times)

    visit(entry, 1.0)
    return sorted(totals.items(), key=lambda kv: -kv[1])[:top]
