"""examples/mtf_two_layer.py against the Mesh-TensorFlow paper's figures 2-4 (arXiv 1811.02084).

The expected block -> devices maps are written out by hand from the figures, with sizes
batch 8, d_model (the paper's io) 4, d_ff (the paper's hidden) 8, on 4 of the 8 CPU devices.
"""
import importlib.util
import pathlib

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from switchzoo import inspector
from switchzoo import layout as layout_lib

_PATH = pathlib.Path(__file__).resolve().parent.parent / "examples" / "mtf_two_layer.py"
_spec = importlib.util.spec_from_file_location("mtf_two_layer", _PATH)
mtf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mtf)

def _mesh(name):
    # The same mesh the example builds; its devices array says which device sits at (r, c).
    return layout_lib.make_mesh(mtf.LAYOUTS[name][0], jax.devices()[:4])


def _held(array) -> dict:
    """{block: sorted device ids} read from the array's own shards, not from block_owners."""
    out = {}
    for shard in array.addressable_shards:
        block = tuple((s.start or 0, n if s.stop is None else s.stop)
                      for s, n in zip(shard.index, array.shape))
        out.setdefault(block, []).append(shard.device.id)
    return {b: sorted(d) for b, d in out.items()}


def _expected(name):
    mesh = _mesh(name)
    if name == "data_parallel":  # Figure 2: batch split 4 ways, weights everywhere
        d0, d1, d2, d3 = (d.id for d in mesh.devices)
        everyone = sorted([d0, d1, d2, d3])
        return {
            "x": {((0, 2), (0, 4)): [d0], ((2, 4), (0, 4)): [d1],
                  ((4, 6), (0, 4)): [d2], ((6, 8), (0, 4)): [d3]},
            "w": {((0, 4), (0, 8)): everyone},
            "h": {((0, 2), (0, 8)): [d0], ((2, 4), (0, 8)): [d1],
                  ((4, 6), (0, 8)): [d2], ((6, 8), (0, 8)): [d3]},
            "v": {((0, 8), (0, 4)): everyone},
            "y": {((0, 2), (0, 4)): [d0], ((2, 4), (0, 4)): [d1],
                  ((4, 6), (0, 4)): [d2], ((6, 8), (0, 4)): [d3]},
        }
    if name == "model_parallel":  # Figure 3: hidden split 4 ways, x and y everywhere
        d0, d1, d2, d3 = (d.id for d in mesh.devices)
        everyone = sorted([d0, d1, d2, d3])
        return {
            "x": {((0, 8), (0, 4)): everyone},
            "w": {((0, 4), (0, 2)): [d0], ((0, 4), (2, 4)): [d1],
                  ((0, 4), (4, 6)): [d2], ((0, 4), (6, 8)): [d3]},
            "h": {((0, 8), (0, 2)): [d0], ((0, 8), (2, 4)): [d1],
                  ((0, 8), (4, 6)): [d2], ((0, 8), (6, 8)): [d3]},
            "v": {((0, 2), (0, 4)): [d0], ((2, 4), (0, 4)): [d1],
                  ((4, 6), (0, 4)): [d2], ((6, 8), (0, 4)): [d3]},
            "y": {((0, 8), (0, 4)): everyone},
        }
    assert name == "data_model_2x2"  # Figure 4: batch over mesh rows, hidden over mesh cols
    d = mesh.devices
    d00, d01, d10, d11 = d[0, 0].id, d[0, 1].id, d[1, 0].id, d[1, 1].id
    return {
        "x": {((0, 4), (0, 4)): sorted([d00, d01]), ((4, 8), (0, 4)): sorted([d10, d11])},
        "w": {((0, 4), (0, 4)): sorted([d00, d10]), ((0, 4), (4, 8)): sorted([d01, d11])},
        "h": {((0, 4), (0, 4)): [d00], ((0, 4), (4, 8)): [d01],
              ((4, 8), (0, 4)): [d10], ((4, 8), (4, 8)): [d11]},
        "v": {((0, 4), (0, 4)): sorted([d00, d10]), ((4, 8), (0, 4)): sorted([d01, d11])},
        "y": {((0, 4), (0, 4)): sorted([d00, d01]), ((4, 8), (0, 4)): sorted([d10, d11])},
    }


# The PartitionSpecs the figures imply, by hand, for h and y.
SPECS = {
    "data_parallel": {"h": P("all"), "y": P("all")},
    "model_parallel": {"h": P(None, "all"), "y": P()},
    "data_model_2x2": {"h": P("rows", "cols"), "y": P("rows")},
}

NAMES = list(mtf.LAYOUTS)


@pytest.fixture(scope="module")
def results():
    assert jax.device_count() >= 4, "tests/conftest.py should give 8 CPU devices"
    return {name: mtf.run(name) for name in NAMES}


def test_layouts_are_the_papers():
    assert mtf.LAYOUTS == {
        "data_parallel": ("all:4", "batch:all", "Figure 2"),
        "model_parallel": ("all:4", "d_ff:all", "Figure 3"),
        "data_model_2x2": ("rows:2,cols:2", "batch:rows,d_ff:cols", "Figure 4"),
    }
    assert set(mtf.TENSORS) == {"x", "w", "h", "v", "y"}


@pytest.mark.parametrize("name", NAMES)
def test_owners_match_figure(name):
    assert mtf.owners(name) == _expected(name)


@pytest.mark.parametrize("name", NAMES)
def test_arrays_live_where_the_figure_says(name, results):
    expected = _expected(name)
    for tensor, array in results[name].items():
        assert _held(array) == expected[tensor], tensor


@pytest.mark.parametrize("name", NAMES)
def test_each_shard_holds_its_slice(name, results):
    out = results[name]
    for tensor, array in out.items():
        full = np.asarray(array)
        for shard in array.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), full[shard.index])


@pytest.mark.parametrize("name", NAMES)
def test_matches_numpy(name, results):
    out = {t: np.asarray(a, dtype=np.float64) for t, a in results[name].items()}
    h = np.maximum(out["x"] @ out["w"], 0)
    np.testing.assert_allclose(out["h"], h, rtol=0, atol=1e-6)
    np.testing.assert_allclose(out["y"], h @ out["v"], rtol=0, atol=1e-6)
    assert np.abs(out["y"]).max() > 0  # not trivially zero


@pytest.mark.parametrize("name", NAMES)
def test_activation_shardings_are_the_layouts(name, results):
    mesh = _mesh(name)
    lay = layout_lib.Layout.create(mtf.LAYOUTS[name][1], mesh)
    for tensor in ("h", "y"):
        got = results[name][tensor].sharding
        assert got == NamedSharding(mesh, SPECS[name][tensor]), tensor
        assert got == lay.sharding(mtf.TENSORS[tensor], np.shape(results[name][tensor])), tensor


def test_draw_writes_png(tmp_path):
    path = mtf.draw("data_model_2x2", "h", tmp_path)
    assert path == tmp_path / "two_layer_data_model_2x2_h.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 1000


# Section 3 of the paper: data-parallel needs no communication in the forward pass; splitting
# hidden makes each processor hold a partial sum of y, which one all-reduce completes.
COLLECTIVES = {"data_parallel": {}, "model_parallel": {"all-reduce": 1},
               "data_model_2x2": {"all-reduce": 1}}


@pytest.mark.parametrize("name", NAMES)
def test_collectives_match_paper(name):
    forward, sh = mtf.program(name)
    args = [jax.ShapeDtypeStruct(mtf.shape(t), np.float32, sharding=sh[t]) for t in "xwv"]
    counts = inspector.count_collectives(forward.lower(*args).compile().as_text())
    assert {k: v for k, v in counts.items() if v} == COLLECTIVES[name]
