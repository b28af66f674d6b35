"""The Mesh-TensorFlow paper's two-layer example, y = relu(x.W).V, in three layouts.

Shazeer et al. 2018 (arXiv 1811.02084), section 3 and figures 2-4. The paper's ``io`` dimension
is our ``d_model`` and its ``hidden`` is our ``d_ff``. Each layout is one layout string; the same
program runs under all three, and the figures show which of 4 devices holds which block.

    python examples/mtf_two_layer.py [--out out/figures]

writes <out>/two_layer_<layout>_<tensor>.png (15 figures; a file whose bytes would not change is
left alone). The committed ones are docs/figures/: --out docs/figures replaces them.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import tempfile

if __name__ == "__main__":
    # A CPU host has one device unless told otherwise; only set this when run as a script, so
    # that importing this module (as the tests do) leaves the caller's XLA flags alone.
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import numpy as np

from switchzoo import inspector
from switchzoo import layout as layout_lib

NUM_DEVICES = 4  # the paper's figures use 4 processors

# name: (mesh spec, layout string, the paper's figure)
LAYOUTS = {
    "data_parallel": ("all:4", "batch:all", "Figure 2"),
    "model_parallel": ("all:4", "d_ff:all", "Figure 3"),
    "data_model_2x2": ("rows:2,cols:2", "batch:rows,d_ff:cols", "Figure 4"),
}

TENSORS = {
    "x": ("batch", "d_model"),
    "w": ("d_model", "d_ff"),
    "h": ("batch", "d_ff"),
    "v": ("d_ff", "d_model"),
    "y": ("batch", "d_model"),
}

# Small enough that every block in a figure is a few rows/columns, and divisible by 4 and 2.
SIZES = {"batch": 8, "d_model": 4, "d_ff": 8}


def shape(tensor: str) -> tuple[int, ...]:
    return tuple(SIZES[d] for d in TENSORS[tensor])


def build(name: str, devices=None) -> layout_lib.Layout:
    """The Layout (and through it the mesh) of one of LAYOUTS, on the first 4 devices."""
    mesh_spec, layout, _ = LAYOUTS[name]
    devices = jax.devices()[:NUM_DEVICES] if devices is None else devices
    return layout_lib.Layout.create(layout, layout_lib.make_mesh(mesh_spec, devices))


def shardings(name: str, devices=None) -> dict:
    lay = build(name, devices)
    return {t: lay.sharding(dims, shape(t), t) for t, dims in TENSORS.items()}


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    # Small integers keep every product and sum exact in float32, so the sharded result can be
    # compared with numpy regardless of the order in which devices add up partial sums.
    rng = np.random.default_rng(seed)
    return {t: rng.integers(-3, 4, shape(t)).astype(np.float32) for t in ("x", "w", "v")}


def program(name: str, devices=None):
    """The jitted forward pass (x, w, v) -> (h, y) under this layout, and its shardings."""
    sh = shardings(name, devices)

    # The program is the same for every layout; GSPMD inserts the communication the layout needs
    # (none for data-parallel, one all-reduce of y's partial sums when d_ff is split). In a net
    # this small propagation alone would reach the same h and y layouts; the constraints state
    # them, as Mesh-TensorFlow does, instead of leaving them to the partitioner.
    def forward(x, w, v):
        h = jax.lax.with_sharding_constraint(jax.nn.relu(x @ w), sh["h"])
        return h, jax.lax.with_sharding_constraint(h @ v, sh["y"])

    return jax.jit(forward, in_shardings=(sh["x"], sh["w"], sh["v"])), sh


def run(name: str, devices=None) -> dict[str, jax.Array]:
    """x, w, h, v, y computed under the layout; each array's .sharding says where it lives."""
    forward, sh = program(name, devices)
    data = {t: jax.device_put(a, sh[t]) for t, a in inputs().items()}
    h, y = forward(data["x"], data["w"], data["v"])
    return {"x": data["x"], "w": data["w"], "h": h, "v": data["v"], "y": y}


def owners(name: str, devices=None) -> dict[str, dict[tuple, list[int]]]:
    """{tensor: {block: [device ids]}}, the content of the paper's figure for this layout."""
    return {t: inspector.block_owners(s, shape(t)) for t, s in shardings(name, devices).items()}


def draw(name: str, tensor: str, out_dir, devices=None) -> pathlib.Path:
    """out_dir/two_layer_<name>_<tensor>.png, replaced only when its bytes change."""
    _, layout, figure = LAYOUTS[name]
    path = pathlib.Path(out_dir) / f"two_layer_{name}_{tensor}.png"
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        new = pathlib.Path(tmp) / path.name
        inspector.draw(shardings(name, devices)[tensor], shape(tensor), TENSORS[tensor],
                       f"{figure} ({layout}): {tensor}", str(new))
        if not path.is_file() or path.read_bytes() != new.read_bytes():
            os.replace(new, path)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="out/figures",
                        help="directory for the PNGs (docs/figures: the committed ones)")
    args = parser.parse_args(argv)
    if jax.device_count() < NUM_DEVICES:
        raise SystemExit(f"needs {NUM_DEVICES} devices, found {jax.device_count()}; set "
                         "XLA_FLAGS=--xla_force_host_platform_device_count=8")
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    for name, (_, layout, figure) in LAYOUTS.items():
        out = run(name)
        ref = np.maximum(np.asarray(out["x"]) @ np.asarray(out["w"]), 0) @ np.asarray(out["v"])
        print(f"{figure} {name} ({layout}): max |y - numpy| = "
              f"{np.abs(np.asarray(out['y']) - ref).max()}")
        for tensor in TENSORS:
            print(f"  {tensor}{TENSORS[tensor]}: {out[tensor].sharding.spec} -> "
                  f"{draw(name, tensor, args.out)}")


if __name__ == "__main__":
    main()
