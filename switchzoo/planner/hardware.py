"""Hardware profiles (data: layouts/hardware/*.toml, installed as switchzoo.layouts) and the
layout search's stated cost model.

A profile gives, per JAX device: peak dense bfloat16 FLOP/s, memory, devices per host, devices
per chip (a TPU v3 chip's two cores are two devices on one chip's links), the fast
interconnect's bandwidth (ICI / NVLink) and the network's between hosts, whether the fast
interconnect spans hosts (a TPU slice) and its topology. Each number names its public source.

The cost model (overlap ignored: the step time is the sum, an estimate):
  compute        = matmul FLOPs per device (switchzoo/planner/hlo.py) / peak_flops
  all-reduce     = 2 (n-1)/n x bytes / bw            (ring; bytes: the buffer)
  all-gather     = (n-1)/n x bytes / bw              (bytes: the gathered result)
  reduce-scatter = (n-1)/n x bytes / bw              (bytes: the full input)
  all-to-all     = (n-1)/n x bytes / bw on a switch; on a torus at least the bisection's
                   time: a group on c chips laid on a d-dimensional torus (torus_dims) of side
                   c^(1/d) has 2 c^((d-1)/d) links across a cut, and n x bytes / 4 cross it
                   each way: max((n-1)/n, n / (8 c^((d-1)/d))) x bytes / bw  (c = n: n^(1/d)/8)
  collective-permute = bytes / bw
where n is the group size and bw the fast interconnect's, or the network's when a group holds
devices of different hosts and the fast interconnect does not span hosts. A group's physical
shape follows from its mesh axes and the mesh order (``placement``): devices are numbered
row-major over the mesh, host by host (jax.make_mesh's order within a host) and chip by chip.
Where a chip's devices sit in different groups of one collective (an outer axis on TPU v3),
those groups run at once over the same chip links, each at bw / (devices per chip in
different groups).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import math
import tomllib

import numpy as np

from switchzoo import registry
from switchzoo.planner import hlo

PACKAGE = "switchzoo.layouts"
FOLDER = "hardware"
FIELDS = ("name", "doc", "peak_flops", "hbm_bytes", "devices_per_host", "devices_per_chip",
          "topology", "torus_dims", "ici_bytes_per_s", "dcn_bytes_per_s", "ici_spans_hosts")
Mesh = tuple[tuple[str, int], ...]            # (axis, size) in mesh order


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one collective's groups lie: whether some group holds devices of different
    hosts, how many chips a group spans, and how many groups share each chip's links."""
    crosses_hosts: bool
    chips: int
    sharing: int


@functools.lru_cache(maxsize=65536)
def placement(mesh: Mesh, axes: tuple[str, ...], devices_per_host: int,
              devices_per_chip: int = 1) -> Placement:
    """The groups spanning ``axes`` of ``mesh`` (every other coordinate fixed), with devices
    numbered row-major over the mesh: ``devices_per_chip`` consecutive ids per chip,
    ``devices_per_host`` per host."""
    names, sizes = [a for a, _ in mesh], [n for _, n in mesh]
    spanned = [names.index(a) for a in axes if a in names]
    rest = [i for i in range(len(names)) if i not in spanned]
    ids = np.arange(math.prod(sizes)).reshape(sizes).transpose(rest + spanned)
    groups = ids.reshape(-1, math.prod(sizes[i] for i in spanned))
    hosts = groups // max(devices_per_host, 1)
    _, together = np.unique(groups[0] // devices_per_chip, return_counts=True)
    return Placement(bool((hosts != hosts[:, :1]).any()), len(together),
                     max(devices_per_chip // int(together.max()), 1))


@dataclasses.dataclass(frozen=True)
class Profile:
    key: str
    name: str
    doc: str
    peak_flops: float
    hbm_bytes: int
    devices_per_host: int
    devices_per_chip: int
    topology: str
    torus_dims: int
    ici_bytes_per_s: float
    dcn_bytes_per_s: float
    ici_spans_hosts: bool
    sources: dict

    def bandwidth(self, c: hlo.Collective) -> float:
        return (self.dcn_bytes_per_s if c.crosses_hosts and not self.ici_spans_hosts
                else self.ici_bytes_per_s)

    def seconds(self, c: hlo.Collective, mesh: Mesh | None = None) -> float:
        """One execution of ``c`` under the textbook cost of its algorithm (module doc). With
        the ``mesh`` it ran on, its groups' chips and shared links come from ``c.axes``;
        without, each device is taken to be a chip of its own."""
        n, bw = c.group, self.bandwidth(c)
        if n <= 1:
            return 0.0
        chips, sharing = n, 1
        if mesh is not None:
            where = placement(tuple(mesh), tuple(c.axes), self.devices_per_host,
                              self.devices_per_chip)
            chips, sharing = where.chips, where.sharing
        network = c.crosses_hosts and not self.ici_spans_hosts
        if not network:
            bw /= sharing                              # chip-mates' groups share the links
        share = (n - 1) / n
        if c.kind == "all-reduce":
            return 2 * share * c.bytes / bw
        if c.kind in ("all-gather", "reduce-scatter"):
            return share * c.bytes / bw
        if c.kind == "all-to-all":
            d = self.torus_dims
            torus = self.topology == "torus" and not network
            cut = n / (8 * chips ** ((d - 1) / d)) if torus else 0.0
            return max(share, cut) * c.bytes / bw
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


def step_cost(program: hlo.Program, profile: Profile, mesh: Mesh | None = None) -> StepCost:
    """The step time of a program (compiled, or the search's analytic one) on ``mesh``."""
    by_kind = dict.fromkeys(hlo.KINDS, 0.0)
    for c in program.collectives:
        by_kind[c.kind] += c.count * profile.seconds(c, mesh)
    return StepCost(program.flops / profile.peak_flops, sum(by_kind.values()), by_kind)
