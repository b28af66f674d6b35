"""Mesh specs and Mesh-TensorFlow layout strings -> shardings.

A mesh spec names the device axes (``data:2,model:2,expert:2``; one size may be ``-1``). A layout
string maps dimension names from ``switchzoo.dims`` to mesh axes
(``batch:data+expert,heads:model,d_ff:model,experts:expert``); a dimension it does not name is
replicated. Parameters are strict: a bad rule is an error naming the tensor and the fix.
Activations are lenient, because one rule serves tensors of many shapes: within one activation
the first dimension claims a mesh axis and later ones that ask for it again stay replicated
(``batch:data,d_model:data`` splits weights over d_model and activations over batch), and an axis
that does not divide the dimension is left out.

``python -m switchzoo.layout`` runs the layout inspector (switchzoo/inspector.py) from this
package's __main__.py; nothing here imports the inspector.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import importlib.resources
import math
import re
import tomllib

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from switchzoo import dims as dims_lib
from switchzoo import registry

PRESETS = "switchzoo.layouts"                 # the presets package (layouts/ in a clone)
DEFAULT_AXES = ("data", "model", "expert")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")       # a mesh axis or a preset name


class LayoutError(ValueError):
    """A mistake in a mesh spec or layout string; the message names the tensor and the fix."""


class DeviceCountError(LayoutError):
    """A well-formed mesh spec that the devices at hand cannot hold."""


# ---------------------------------------------------------------------------------------- meshes

@dataclasses.dataclass(frozen=True)
class MeshSpec:
    axes: tuple[str, ...]
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return ",".join(f"{a}:{n}" for a, n in zip(self.axes, self.shape))


def parse_mesh(text: str, num_devices: int | None = None) -> MeshSpec:
    """Parses ``data:2,model:2,expert:2``; resolves one ``-1`` against ``num_devices``."""
    if num_devices is None:
        num_devices = jax.device_count()
    spec = mesh_sizes(text)
    shape = list(spec.shape)
    known = math.prod(n for n in shape if n != -1)
    if -1 in shape:
        if num_devices % known:
            raise DeviceCountError(
                f"mesh spec {text!r}: the fixed axes ({known} devices) do not divide the "
                f"{num_devices} devices; choose sizes that divide {num_devices}")
        shape[shape.index(-1)] = num_devices // known
    elif known != num_devices:
        raise DeviceCountError(
            f"mesh spec {text!r} has {known} devices but {num_devices} are available; make the "
            f"sizes multiply to {num_devices} (or use -1 for one axis)")
    return MeshSpec(spec.axes, tuple(shape))


def mesh_sizes(text: str) -> MeshSpec:
    """The axes and sizes a mesh spec writes, one of them possibly -1 (the devices left), with
    no devices consulted: a LayoutError for a spec that is not well formed."""
    if not isinstance(text, str) or not text.strip():
        raise LayoutError(f"mesh spec {text!r} is empty; write axes as 'data:2,model:2,expert:2'")
    axes, shape = [], []
    for entry in text.split(","):
        name, sep, size = entry.strip().partition(":")
        if not sep or not NAME.match(name.strip()):
            raise LayoutError(f"mesh spec {text!r}: entry {entry!r} is not 'axis:size'; "
                              "write axes as 'data:2,model:2,expert:2'")
        name = name.strip()
        try:
            n = int(size)
        except ValueError:
            raise LayoutError(f"mesh spec {text!r}: size {size!r} of axis '{name}' is not an "
                              "integer; give a positive size or -1 for all devices left") from None
        if n == 0 or n < -1:
            raise LayoutError(f"mesh spec {text!r}: axis '{name}' has size {n}; give a positive "
                              "size or -1 for all devices left")
        if name in axes:
            raise LayoutError(f"mesh spec {text!r}: axis '{name}' appears twice; name each axis once")
        axes.append(name)
        shape.append(n)
    if shape.count(-1) > 1:
        raise LayoutError(f"mesh spec {text!r}: more than one axis is -1; at most one axis may "
                          "take the devices left")
    return MeshSpec(tuple(axes), tuple(shape))


def make_mesh(spec: str | MeshSpec, devices=None) -> Mesh:
    """A mesh whose axes are Auto, so that GSPMD propagates shardings through the program."""
    devices = jax.devices() if devices is None else devices
    if isinstance(spec, str):
        spec = parse_mesh(spec, len(devices))
    if math.prod(spec.shape) != len(devices):
        raise DeviceCountError(f"mesh {spec} has {math.prod(spec.shape)} devices but "
                          f"{len(devices)} are given; make the sizes multiply to {len(devices)}")
    return jax.make_mesh(spec.shape, spec.axes, axis_types=(AxisType.Auto,) * len(spec.axes),
                         devices=devices)


# --------------------------------------------------------------------------------------- layouts

@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    layout: str
    mesh: str
    doc: str


@functools.cache
def presets() -> dict[str, Preset]:
    """The named layouts shipped in layouts/*.toml (the switchzoo.layouts package)."""
    out = {}
    files = importlib.resources.files(PRESETS).iterdir()
    for path in sorted((f for f in files if f.name.endswith(".toml")), key=lambda f: f.name):
        name = path.name.removesuffix(".toml")
        data = tomllib.loads(path.read_text())
        out[name] = Preset(name, data["layout"], data["mesh"], data.get("doc", ""))
    return out


def layout_string(name_or_string: str) -> str:
    """A preset's layout string, or the argument itself when it is a literal layout string."""
    if ":" in name_or_string or not name_or_string.strip():
        return name_or_string
    known = presets()
    if name_or_string not in known:
        raise LayoutError(f"unknown layout preset '{name_or_string}'"
                          f"{registry.suggest(name_or_string, known)}; choose one of {sorted(known)} "
                          "or write a layout string such as 'batch:data,d_ff:model'")
    return known[name_or_string].layout


def parse_layout(text: str, mesh_axes: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """``batch:data+expert,d_ff:model`` -> {"batch": ("data", "expert"), "d_ff": ("model",)}."""
    rules: dict[str, tuple[str, ...]] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        dim, sep, axes = entry.partition(":")
        dim = dim.strip()
        if not sep or not dim or not axes.strip():
            raise LayoutError(f"layout {text!r}: entry {entry!r} is not 'dim:axis' (or "
                              "'dim:axis+axis'); e.g. 'batch:data,d_ff:model'")
        if dim not in dims_lib.VOCABULARY:
            raise LayoutError(f"layout {text!r}: unknown dimension '{dim}'"
                              f"{registry.suggest(dim, dims_lib.NAMES)}; dimensions are "
                              f"{', '.join(dims_lib.NAMES)}")
        if dim in rules:
            raise LayoutError(f"layout {text!r}: dimension '{dim}' is laid out twice; give each "
                              "dimension one entry (use '+' to split it over several axes)")
        names = tuple(a.strip() for a in axes.split("+"))
        for axis in names:
            if axis not in mesh_axes:
                raise LayoutError(f"layout {text!r}: dimension '{dim}' uses mesh axis '{axis}'"
                                  f"{registry.suggest(axis, mesh_axes)}, which the mesh does not have; "
                                  f"mesh axes are {list(mesh_axes)}")
        if len(set(names)) != len(names):
            raise LayoutError(f"layout {text!r}: dimension '{dim}' names a mesh axis twice; "
                              "list each axis once")
        rules[dim] = names
    return rules


class Layout:
    """Logical rules bound to a mesh: dims -> PartitionSpec / NamedSharding."""

    def __init__(self, rules: dict[str, tuple[str, ...]], mesh: Mesh, text: str = "",
                 exchange: str | None = None):
        self.rules, self.mesh, self.text = rules, mesh, text
        # Set only inside a per-shard vmap (``within``): the vmap's axis name over which the
        # experts' FFN weights are split, each shard holding its own (moe dispatches by
        # all_to_all over it).
        self.exchange = exchange

    @classmethod
    def create(cls, layout: str, mesh: Mesh | str) -> "Layout":
        """``layout`` is a preset name or a layout string; ``mesh`` a Mesh or a mesh spec."""
        mesh = make_mesh(mesh) if isinstance(mesh, str) else mesh
        text = layout_string(layout)
        return cls(parse_layout(text, tuple(mesh.axis_names)), mesh, text)

    def within(self, axes: tuple[str, ...], exchange: str | None = None) -> "Layout":
        """This layout inside a jax.vmap whose mapped dim is split over mesh ``axes`` (its
        spmd_axis_name): those axes leave every rule, since the mapped dim holds them.
        ``exchange``: the vmap's axis name where each shard holds its own experts."""
        rules = {d: kept for d, a in self.rules.items()
                 if (kept := tuple(x for x in a if x not in axes))}
        return Layout(rules, self.mesh, self.text, exchange)

    def axes(self, dim: str | None) -> tuple[str, ...]:
        """The mesh axes the layout splits dimension ``dim`` over, in order."""
        if dim is None:
            return ()
        if dim in self.rules:
            return self.rules[dim]
        return self.rules.get(dims_lib.ALIASES.get(dim, ""), ())

    def parts(self, dim: str) -> int:
        """How many shards the layout splits dimension ``dim`` into (1: replicated)."""
        return math.prod(self.mesh.shape[a] for a in self.axes(dim))

    def spec(self, dims, shape=None, name: str = "tensor", strict: bool = True) -> P:
        """The PartitionSpec of a tensor with these logical dims (see module doc for strict)."""
        dims = dims_lib.check(tuple(dims), name)
        if shape is not None and len(shape) != len(dims):
            raise LayoutError(f"{name}: shape {tuple(shape)} has rank {len(shape)} but dims "
                              f"{dims} name {len(dims)}; annotate one name per axis")
        used, entries = {}, []
        for i, dim in enumerate(dims):
            axes = []
            for axis in self.axes(dim):
                if axis in used:
                    if strict:
                        raise LayoutError(
                            f"{name} {dims}: mesh axis '{axis}' is used by both '{used[axis]}' "
                            f"and '{dim}'; a tensor can be split over an axis once, so map one "
                            "of them to another axis (or to none) in the layout")
                    continue
                axes.append(axis)
            if shape is not None and axes:
                parts = math.prod(self.mesh.shape[a] for a in axes)
                if shape[i] % parts:
                    if strict:
                        raise LayoutError(
                            f"{name} {dims} shape {tuple(shape)}: dimension '{dim}' of size "
                            f"{shape[i]} is not divisible by mesh axes {'+'.join(axes)} "
                            f"({parts} devices); change the mesh, the model size, or drop "
                            f"'{dim}' from the layout")
                    kept = []
                    for axis in axes:        # keep each axis that still divides, in order
                        if shape[i] % (math.prod(self.mesh.shape[a] for a in kept)
                                       * self.mesh.shape[axis]) == 0:
                            kept.append(axis)
                    axes = kept
            for axis in axes:
                used[axis] = dim
            entries.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
        while entries and entries[-1] is None:
            entries.pop()
        return P(*entries)

    def sharding(self, dims, shape=None, name: str = "tensor", strict: bool = True):
        return NamedSharding(self.mesh, self.spec(dims, shape, name, strict))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def constrain(self, x, dims):
        return jax.lax.with_sharding_constraint(x, self.sharding(dims, x.shape, strict=False))

    def __repr__(self) -> str:
        return f"Layout({self.text!r}, mesh={dict(self.mesh.shape)})"


# ------------------------------------------------------------------- activation constraints

_ACTIVE: contextvars.ContextVar[Layout | None] = contextvars.ContextVar("layout", default=None)


@contextlib.contextmanager
def use(layout: Layout | None):
    """Within this block (while tracing), ``constrain`` applies ``layout`` to activations."""
    token = _ACTIVE.set(layout)
    try:
        yield layout
    finally:
        _ACTIVE.reset(token)


def active() -> Layout | None:
    return _ACTIVE.get()


def constrain(x, dims):
    """Pins activation ``x`` (logical ``dims``) to the active layout; a no-op without one."""
    layout = _ACTIVE.get()
    if layout is None:
        dims_lib.check(tuple(dims), "activation")
        return x
    return layout.constrain(x, dims)


def experts_cut(weights_dims, axes_of) -> tuple[list[bool], tuple[str, ...]] | None:
    """How a pipeline stage run per batch shard (switchzoo/pipeline.py) holds weights of these
    dims, where ``axes_of(dim)`` gives the mesh axes of size > 1 a dim is split over: per
    weight, True where its experts are cut over the shards of some of the batch's axes (an
    expert FFN weight, experts and d_ff, whose experts are split over batch axes only, and
    those a leading or trailing run of the batch's, in order: the same run for every such
    weight), False where each shard holds a copy; and the axes the experts are cut over (()
    where none are). None where an expert FFN weight is split over the batch's axes in any
    other way (the stage then runs unsharded)."""
    batch = tuple(axes_of("batch"))
    out, over_axes = [], None
    for dims in weights_dims:
        if not ("experts" in dims and "d_ff" in dims):
            out.append(False)
            continue
        over = {d: tuple(a for a in axes_of(d) if a in batch) for d in dims}
        if any(over[d] for d in dims if d != "experts"):
            return None
        cut = over["experts"]
        if cut:
            n = len(cut)
            if (cut != tuple(axes_of("experts")) or cut not in (batch[:n], batch[-n:])
                    or over_axes not in (None, cut)):
                return None
            over_axes = cut
        out.append(bool(cut))
    return out, over_axes or ()


def spec_axes(entry) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, an axis name, or a tuple of them)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
