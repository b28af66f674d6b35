"""Hardware profiles (data: layouts/hardware/*.toml, installed as switchzoo.layouts) and the
layout search's stated cost model.

A profile gives, per JAX device: peak dense bfloat16 FLOP/s, memory, devices per host, the
fast interconnect's bandwidth (ICI / NVLink) and the network's between hosts, whether the fast
interconnect spans hosts (a TPU slice) and its topology. Each number names its public source.

The cost model (overlap ignored: the step time is the sum, an upper bound):
  compute        = matmul FLOPs per device (switchzoo/layout/hlo.py) / peak_flops
  all-reduce     = 2 (n-1)/n x bytes / bw            (ring; bytes: the buffer)
  all-gather     = (n-1)/n x bytes / bw              (bytes: the gathered result)
  reduce-scatter = (n-1)/n x bytes / bw              (bytes: the full input)
  all-to-all     = (n-1)/n x bytes / bw on a switch; on a torus at least the bisection's
                   time: n devices laid on a d-dimensional torus (torus_dims) of side n^(1/d)
                   have 2 n^((d-1)/d) links across a cut, and n x bytes / 4 cross it each way:
                   max((n-1)/n x bytes / bw, n^(1/d) x bytes / (8 bw))
  collective-permute = bytes / bw
where n is the group size and bw the fast interconnect's, or the network's when a group holds
devices of different hosts and the fast interconnect does not span hosts. Devices are taken to
be numbered host by host in the mesh's row-major order (jax.make_mesh's order within a host).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import tomllib

from switchzoo import registry
from switchzoo.layout import hlo

PACKAGE = "switchzoo.layouts"
FOLDER = "hardware"
FIELDS = ("name", "doc", "peak_flops", "hbm_bytes", "devices_per_host", "topology",
          "torus_dims", "ici_bytes_per_s", "dcn_bytes_per_s", "ici_spans_hosts")


@dataclasses.dataclass(frozen=True)
class Profile:
    key: str
    name: str
    doc: str
    peak_flops: float
    hbm_bytes: int
    devices_per_host: int
    topology: str
    torus_dims: int
    ici_bytes_per_s: float
    dcn_bytes_per_s: float
    ici_spans_hosts: bool
    sources: dict

    def bandwidth(self, c: hlo.Collective) -> float:
        return (self.dcn_bytes_per_s if c.crosses_hosts and not self.ici_spans_hosts
                else self.ici_bytes_per_s)

    def seconds(self, c: hlo.Collective) -> float:
        """One execution of ``c`` under the textbook cost of its algorithm (module doc)."""
        n, bw = c.group, self.bandwidth(c)
        if n <= 1:
            return 0.0
        share = (n - 1) / n
        if c.kind == "all-reduce":
            return 2 * share * c.bytes / bw
        if c.kind in ("all-gather", "reduce-scatter"):
            return share * c.bytes / bw
        if c.kind == "all-to-all":
            torus = self.topology == "torus" and not (c.crosses_hosts and not self.ici_spans_hosts)
            return max(share, n ** (1 / self.torus_dims) / 8 if torus else 0.0) * c.bytes / bw
        return c.bytes / bw                            # collective-permute


@functools.cache
def profiles() -> dict[str, Profile]:
    out = {}
    folder = importlib.resources.files(PACKAGE) / FOLDER
    for path in sorted((f for f in folder.iterdir() if f.name.endswith(".toml")),
                       key=lambda f: f.name):
        data = tomllib.loads(path.read_text())
        missing = [f for f in FIELDS if f not in data]
        if missing:
            raise ValueError(f"hardware profile {path.name} lacks {missing}")
        key = path.name.removesuffix(".toml")
        out[key] = Profile(key, **{f: data[f] for f in FIELDS}, sources=data.get("sources", {}))
    return out


def get(key: str) -> Profile:
    known = profiles()
    if key not in known:
        raise ValueError(f"unknown hardware profile '{key}'{registry.suggest(key, known)}; "
                         f"choose one of {sorted(known)} (layouts/hardware/*.toml)")
    return known[key]


@dataclasses.dataclass(frozen=True)
class StepCost:
    compute_s: float
    communication_s: float
    by_kind_s: dict

    @property
    def step_s(self) -> float:
        return self.compute_s + self.communication_s


def step_cost(program: hlo.Program, profile: Profile) -> StepCost:
    by_kind = dict.fromkeys(hlo.KINDS, 0.0)
    for c in program.collectives:
        by_kind[c.kind] += c.count * profile.seconds(c)
    return StepCost(program.flops / profile.peak_flops, sum(by_kind.values()), by_kind)
