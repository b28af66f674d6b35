"""What a compiled SPMD program does, read from its HLO text: every collective with its bytes,
group size and the mesh axes its replica groups span, and the matmul FLOPs, each weighted by
how often it runs (a while loop's body runs its known trip count: a scanned stack of layers is
one loop, and XLA's own ``cost_analysis()`` counts a loop body once).

Conventions (the textbook costs in switchzoo/planner/hardware.py read these):
  * all-reduce, all-to-all, collective-permute: ``bytes`` is the per-device buffer (the result);
  * all-gather: ``bytes`` is the gathered result; reduce-scatter: the full input (result x n).
  * Replica groups hold partition ids: positions in the mesh's device array, row-major, so a
    group's mesh axes are those along which its members' coordinates differ.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re

import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
          "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
          "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(%s)\[([0-9,]*)\]" % "|".join(_BYTES))
_HEADER = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\((.*)$")
_CALLS = re.compile(r"\b(?:calls|body|to_apply|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    bytes: int                  # see the module doc
    group: int                  # devices per replica group
    axes: tuple[str, ...]       # mesh axes the groups span
    crosses_hosts: bool         # some group holds devices of different hosts
    count: int                  # executions per step (loop trip counts multiplied in)


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape: ``f32[16,256]{1,0}`` or a tuple of them."""
    return sum(_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d)
               for t, dims in _ARRAY.findall(shape))


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _transposed_iota(text: str) -> np.ndarray:
    """``[2,2,2]T(0,2,1)`` -> iota(8) reshaped to [2,2,2], transposed, flattened."""
    m = re.match(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", text.strip())
    reshape = [int(x) for x in m.group(1).split(",")]
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    if m.group(2):
        ids = ids.transpose([int(x) for x in m.group(2).split(",")])
    return ids.reshape(-1)


def _iota(text: str) -> np.ndarray:
    """``[4,2]<=[2,2,2]T(0,2,1)`` -> the device ids as a [4, 2] array (rows are groups)."""
    out, _, source = text.partition("<=")
    return _transposed_iota(source).reshape([int(x) for x in out.strip("[]").split(",")])


def replica_groups(attrs: str, num_devices: int) -> list[list[int]]:
    """The groups of partition ids of one collective's attributes (every form XLA prints:
    explicit lists, iota ``[G,S]<=[...]``, mesh-axes ``mesh[...] ... {'axis_i'}``, and a
    collective-permute's source-target pairs, each pair a group)."""
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", attrs)
    if m:
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)", m.group(1) + "}")]
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\((\[[\d,]+\]"
                  r"(?:T\([\d,]+\))?)\))?\s*\{([^}]*)\}", attrs)
    if m:
        sizes = dict((a, int(n)) for a, n in re.findall(r"'(\w+)'=(\d+)", m.group(1)))
        names = list(sizes)
        ids = _transposed_iota(m.group(2)) if m.group(2) else np.arange(num_devices)
        ids = ids.reshape([sizes[a] for a in names])
        spanned = [names.index(a) for a in re.findall(r"'(\w+)'", m.group(3))]
        rest = [i for i in range(len(names)) if i not in spanned]
        ids = ids.transpose(rest + spanned)
        return ids.reshape(-1, math.prod(sizes[names[i]] for i in spanned) or 1).tolist()
    m = re.search(r"replica_groups=(\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)", attrs)
    if m:
        return _iota(m.group(1)).tolist()
    m = re.search(r"replica_groups=\{(\{[\d,{}]*\})\}", attrs)
    if m and m.group(1) != "{}":
        return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}",
                                                                         m.group(1))]
    return [list(range(num_devices))]          # no groups: every device (one replica group)


def group_axes(groups: list[list[int]], mesh_shape: dict[str, int]) -> tuple[str, ...]:
    """The mesh axes along which some group's members differ (partition ids row-major)."""
    names, sizes = list(mesh_shape), list(mesh_shape.values())
    varied = set()
    for g in groups:
        coords = np.array(np.unravel_index(np.asarray(g), sizes)).T
        varied.update(i for i in range(len(names)) if len(set(coords[:, i])) > 1)
    return tuple(names[i] for i in sorted(varied))


@dataclasses.dataclass
class _Computation:
    instructions: list = dataclasses.field(default_factory=list)   # (name, shape, op, rest)
    calls: list = dataclasses.field(default_factory=list)          # (callee, multiplier)


def _parse(text: str) -> tuple[dict[str, _Computation], str]:
    comps: dict[str, _Computation] = {}
    entry, current = None, None
    for line in text.splitlines():
        head = _HEADER.match(line)
        if head and "=" not in line.split("(")[0]:
            current = comps.setdefault(head.group(1), _Computation())
            if line.startswith("ENTRY"):
                entry = head.group(1)
            continue
        m = _INSTR.match(line) if current is not None else None
        if not m:
            continue
        name, shape, op, rest = m.groups()
        current.instructions.append((name, shape, op, rest))
        trip = _TRIP.search(rest)
        times = int(trip.group(1)) if op == "while" and trip else 1
        for callee in _CALLS.findall(rest):
            if op in ("all-reduce", "reduce-scatter", "reduce", "reduce-window", "scatter",
                      "select-and-scatter", "sort", "map", "all-reduce-start"):
                continue                       # a reducer or comparator, not a program part
            current.calls.append((callee, times))
        for branches in _BRANCHES.findall(rest):
            current.calls += [(b.strip().lstrip("%"), 1) for b in branches.split(",")]
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, entry


def _multiplicities(comps: dict[str, _Computation], entry: str) -> dict[str, int]:
    """How many times each computation runs per call of the entry (loops multiply)."""
    times: dict[str, int] = collections.defaultdict(int)

    def visit(name: str, n: int, depth: int = 0):
        if name not in comps or depth > 64:
            return
        times[name] += n
        for callee, k in comps[name].calls:
            visit(callee, n * k, depth + 1)
    visit(entry, 1)
    return times


def _dot_flops(shape: str, rest: str, shapes: dict[str, str]) -> int:
    """2 x output elements x contracted size of one dot."""
    operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
    if not operands or operands[0] not in shapes:
        return 0
    lhs = _dims(shapes[operands[0]])
    k = math.prod(lhs[int(i)] for i in contracting.group(1).split(",") if i) if contracting else 1
    return 2 * math.prod(_dims(shape)) * k


@dataclasses.dataclass
class Program:
    collectives: list[Collective]
    flops: int                       # matmul FLOPs per device per step (dots, loops counted)

    def bytes_by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for c in self.collectives:
            out[c.kind] += c.bytes * c.count
        return out

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for c in self.collectives:
            out[c.kind] += c.count
        return out


def read(text: str, mesh_shape: dict[str, int], devices_per_host: int | None = None) -> Program:
    """The collectives and matmul FLOPs of a compiled SPMD program (``compiled.as_text()``)
    on a mesh of ``mesh_shape`` (axis -> size, in the mesh's order)."""
    comps, entry = _parse(text)
    times = _multiplicities(comps, entry)
    n = math.prod(mesh_shape.values())
    found: dict[tuple, int] = collections.Counter()
    flops = 0
    for cname, comp in comps.items():
        k = times.get(cname, 0)
        if not k:
            continue
        shapes = {name: shape for name, shape, _, _ in comp.instructions}
        for name, shape, op, rest in comp.instructions:
            if op == "dot":
                flops += k * _dot_flops(shape, rest, shapes)
                continue
            kind = op.removesuffix("-start")
            if kind not in KINDS:
                continue
            groups = replica_groups(rest, n)
            size = len(groups[0]) if groups else 1
            nbytes = shape_bytes(shape)
            if op.endswith("-start") and kind == "all-gather":
                nbytes = shape_bytes(shape.split("), (")[-1]) if "), (" in shape else nbytes
            if kind == "reduce-scatter":
                nbytes *= size
            if kind == "collective-permute":
                size = 2
            hosts = bool(devices_per_host) and any(
                len({d // devices_per_host for d in g}) > 1 for g in groups)
            found[(kind, nbytes, size, group_axes(groups, mesh_shape), hosts)] += k
    return Program([Collective(kind, b, g, axes, hosts, count)
                    for (kind, b, g, axes, hosts), count in sorted(found.items())], flops)


def loop_flops(text: str) -> int:
    """Matmul FLOPs per device of the dots that run more than once per step (in loops: a
    scanned or pipelined stack), loop trip counts multiplied in."""
    comps, entry = _parse(text)
    times = _multiplicities(comps, entry)
    total = 0
    for name, comp in comps.items():
        if times.get(name, 0) < 2:
            continue
        shapes = {n: s for n, s, _, _ in comp.instructions}
        total += times[name] * sum(_dot_flops(shape, rest, shapes)
                                   for _, shape, op, rest in comp.instructions if op == "dot")
    return total


def data_movement(text: str, ops=("copy", "dynamic-update-slice")) -> dict[str, dict]:
    """Per op kind in ``ops``: how many run per step and the bytes they write (a copy its
    result; an in-place dynamic-update-slice its update, operand 1), loop trip counts
    multiplied in; with the largest instructions (name, bytes, runs). A copy inside a fusion
    is a layout change of the fused loop, not a buffer written, and is not counted; a fused
    dynamic-update-slice writes its update in place, and is."""
    comps, entry = _parse(text)
    times = _multiplicities(comps, entry)
    fused = set(re.findall(r"\sfusion\(.*?calls=%([\w.\-]+)", text))
    out = {op: {"count": 0, "bytes": 0, "largest": []} for op in ops}
    for cname, comp in comps.items():
        k = times.get(cname, 0)
        shapes = {name: shape for name, shape, _, _ in comp.instructions}
        for name, shape, op, rest in comp.instructions:
            if not k or op not in out or (op == "copy" and cname in fused):
                continue
            if op == "dynamic-update-slice":
                operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])
                shape = shapes.get(operands[1], "") if len(operands) > 1 else ""
            nbytes = shape_bytes(shape)
            out[op]["count"] += k
            out[op]["bytes"] += k * nbytes
            out[op]["largest"].append((name, nbytes, k))
    for row in out.values():
        row["largest"] = sorted(row["largest"], key=lambda r: -r[1] * r[2])[:8]
    return out
