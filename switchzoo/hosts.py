"""Which rows of each global batch this process reads, and the global arrays built from them.

The global batch of B rows is split into S *batch shards*: the shards of the mesh axes the
layout maps ``batch`` to (``batch:data`` on data:4 -> S = 4). Its rows are packed from K
*input shards*, streams of their own (switchzoo.data.pipeline.TrainIterator): K is
data.input_shards, or S of the run's first mesh, and a resume keeps it. So the global batch
depends on K alone, never on the mesh or on how many processes read it: 2 processes give
exactly what 1 gives. A process reads only the rows its addressable devices hold; axes that
replicate the batch (expert or model axes not in the batch's layout) make processes that
share a shard read the same rows.

    share = hosts.share(layout, rows=B)     # this process: shards first..first+count-1
    arrays = hosts.assemble(local_batch, layout, share)   # jax.Arrays of the global batch
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import jax
import numpy as np
from jax.experimental import multihost_utils

from switchzoo import state as state_lib


@dataclasses.dataclass(frozen=True)
class Share:
    """This process's part of a global batch of ``rows`` rows split into ``shards`` shards."""
    process: int
    processes: int
    shards: int
    first: int          # this process reads shards first .. first + count - 1
    count: int
    rows: int

    @property
    def rows_per_shard(self) -> int:
        return self.rows // self.shards

    @property
    def local_shards(self) -> range:
        return range(self.first, self.first + self.count)

    @property
    def row_range(self) -> tuple[int, int]:
        """[a, b): the global rows this process reads."""
        return self.first * self.rows_per_shard, (self.first + self.count) * self.rows_per_shard

    def describe(self, examples: int, streams: range | None = None, inputs: int = 0) -> str:
        """``streams`` of ``inputs``: the input shards this process packs, said where their
        count is not the mesh's batch shard count (data.input_shards, or a resumed run's)."""
        a, b = self.row_range
        packs = (f"; input shards {streams.start}..{streams.stop - 1} of {inputs}"
                 if inputs and inputs != self.shards else "")
        return (f"input: process {self.process}/{self.processes} reads rows {a}..{b - 1} of each "
                f"global batch ({examples:,} examples, {b - a} per step; batch shards "
                f"{self.first}..{self.first + self.count - 1} of {self.shards}{packs})")


def share(layout, rows: int) -> Share:
    """This process's batch shards under ``layout``, for a global batch of ``rows`` rows.

    Raises ValueError when the rows do not split evenly into the shards, or when this
    process's devices hold batch shards that are not one contiguous run (a mesh whose batch
    axes do not follow the processes)."""
    sharding = state_lib.batch_shardings(layout)
    shards = layout.parts("batch")
    axes = layout.rules.get("batch", ())
    if rows % shards:
        raise ValueError(
            f"the global batch of {rows} rows does not split into the {shards} batch shards of "
            f"mesh axes {'+'.join(axes)}; make per_device_batch_size x devices a multiple of "
            f"{shards}")
    first, count = held_shards(sharding.addressable_devices_indices_map((rows,)).values(),
                               rows // shards, axes)
    return Share(jax.process_index(), jax.process_count(), shards, first, count, rows)


def held_shards(indices, per: int, axes=()) -> tuple[int, int]:
    """(first, count) of the batch shards of ``per`` rows that these device indices (one
    tuple of slices per device) hold; a ValueError unless they are one contiguous run."""
    held = sorted({(index[0].start or 0) // per for index in indices})
    if held != list(range(held[0], held[-1] + 1)):
        raise ValueError(
            f"this process's devices hold batch shards {held}, not one contiguous run: the "
            f"mesh axes the batch is split over ({'+'.join(axes)}) do not follow the "
            "processes; list the batch's mesh axes in the order of the mesh (e.g. "
            "batch:data+expert, not batch:expert+data), so that each process holds "
            "neighbouring rows")
    return held[0], len(held)


def assemble(local: dict, layout, share_: Share) -> dict:
    """This process's rows (numpy, ``share_.row_range``) -> the global batch. One process
    passes its (global) numpy batch on: the jitted step places it."""
    if share_.processes == 1:
        return local
    sharding = state_lib.batch_shardings(layout)
    return {k: jax.make_array_from_process_local_data(sharding, v, (share_.rows,) + v.shape[1:])
            for k, v in local.items()}


def gather(x: jax.Array) -> np.ndarray:
    """A global array, whole, as numpy on every process (for small results: decoded ids)."""
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(x))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def allgather_json(value, processes: int | None = None) -> list:
    """Every process's ``value`` (JSON-ready), in process order, on every process."""
    if (processes or jax.process_count()) == 1:
        return [value]
    data = np.frombuffer(json.dumps(value, sort_keys=True).encode(), np.uint8)
    sizes = multihost_utils.process_allgather(np.array([data.size], np.int32))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    rows = multihost_utils.process_allgather(padded)
    return [json.loads(bytes(row[:int(n)]).decode()) for row, n in
            zip(rows.reshape(len(sizes.reshape(-1)), -1), sizes.reshape(-1))]


def check_same_config(config_json: str) -> None:
    """Every process must run the same config: compared by hash at start-up, before anything
    is written; a difference is an error on every process naming the processes that differ."""
    digest = hashlib.sha1(config_json.encode()).hexdigest()[:12]
    digests = allgather_json(digest)
    if len(set(digests)) > 1:
        groups = {}
        for i, d in enumerate(digests):
            groups.setdefault(d, []).append(i)
        listing = "; ".join(f"processes {v} have config {k}" for k, v in groups.items())
        raise ValueError(f"the processes were given different configs ({listing}); start every "
                         "process with the same --config and flags")


def agreed_share(layout, rows: int) -> Share:
    """``share`` on every process, where an error on any process is an error on all (else the
    others would wait for it in the first collective)."""
    try:
        mine, problem = share(layout, rows), None
    except ValueError as e:
        mine, problem = None, str(e)
    problems = allgather_json(problem)
    bad = [(i, p) for i, p in enumerate(problems) if p]
    if bad:
        i, p = bad[0]
        raise ValueError(p if len(problems) == 1 or p == problem else f"process {i}: {p}")
    return mine


def row_digests(local: dict, share_: Share) -> dict[str, list[str]]:
    """{shard: [sha1 of each of its rows]} of this process's rows."""
    per, out = share_.rows_per_shard, {}
    for i, shard in enumerate(share_.local_shards):
        out[str(shard)] = []
        for row in range(i * per, (i + 1) * per):
            h = hashlib.sha1()
            for key in sorted(local):
                h.update(key.encode())
                h.update(np.ascontiguousarray(local[key][row]).tobytes())
            out[str(shard)].append(h.hexdigest())
    return out


def _sha1(digests: list[str]) -> str:
    return hashlib.sha1("".join(digests).encode()).hexdigest()


def shard_digests(local: dict, share_: Share) -> dict[str, str]:
    """{shard: sha1 of its rows} of this process's rows (fingerprints of the batch a step read)."""
    return {shard: _sha1(rows) for shard, rows in row_digests(local, share_).items()}


def batch_fingerprint(local: dict, share_: Share) -> dict:
    """The global batch's fingerprint, on every process: ``batch_sha1`` (of its rows' digests
    in order: the same batch gives the same value on any mesh), ``shard_sha1`` (one per batch
    shard of this mesh) and ``shard_process`` (the process that read each shard first).
    Collective when there are several processes."""
    gathered = allgather_json(row_digests(local, share_), share_.processes)
    digests, readers = {}, {}
    for process, part in enumerate(gathered):
        for shard, d in part.items():
            digests.setdefault(int(shard), d)
            readers.setdefault(int(shard), process)
    ordered = [digests[s] for s in range(share_.shards)]
    return {"batch_sha1": _sha1([row for shard in ordered for row in shard]),
            "shard_sha1": [_sha1(shard) for shard in ordered],
            "shard_process": [readers[s] for s in range(share_.shards)]}
