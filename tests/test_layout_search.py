"""Layout search (switchzoo/layout/search.py): the HLO reading against programs whose
collectives and FLOPs are known, the enumeration and its pruning, a small search end to end
(its memory equals the dry run's, its collectives the compiled HLO's), and bad input."""
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from switchzoo import dry_run, inspector
from switchzoo.layout import LayoutError, command, hardware, hlo, search

SHAPE = {"data": 2, "model": 2, "expert": 2}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 2, 2), tuple(SHAPE), axis_types=(AxisType.Auto,) * 3)


def _read(mesh, f, in_specs, out_specs, x):
    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                              check_vma=False))
    return hlo.read(g.lower(x).compile().as_text(), SHAPE, devices_per_host=4)


X = jax.ShapeDtypeStruct((8, 64, 32), jnp.float32)       # 65,536 bytes per device
FULL = 8 * 64 * 32 * 4


@pytest.mark.parametrize("axes", [("data",), ("expert",), ("model",), ("data", "expert"),
                                  ("data", "model", "expert")])
def test_all_reduce_bytes_group_and_axes(mesh, axes):
    [c] = _read(mesh, lambda a: jax.lax.psum(a, axes), P(), P(), X).collectives
    assert (c.kind, c.bytes, c.group, c.axes, c.count) == (
        "all-reduce", FULL, math.prod(SHAPE[a] for a in axes), axes, 1)
    assert c.crosses_hosts == ("data" in axes)     # 4 devices per host: data is the outer axis


def test_every_kind_and_loop_trip_counts(mesh):
    [ag] = _read(mesh, lambda a: jax.lax.all_gather(a, "model", axis=1, tiled=True),
                 P(None, "model"), P(), X).collectives
    assert (ag.kind, ag.bytes, ag.group, ag.axes) == ("all-gather", FULL, 2, ("model",))
    [rs] = _read(mesh, lambda a: jax.lax.psum_scatter(a, "expert", scatter_dimension=1,
                                                      tiled=True), P(), P(None, "expert"),
                 X).collectives
    assert (rs.kind, rs.bytes, rs.group, rs.axes) == ("reduce-scatter", FULL, 2, ("expert",))
    [a2a] = _read(mesh, lambda a: jax.lax.all_to_all(a, "expert", 0, 1, tiled=True), P(), P(),
                  X).collectives
    assert (a2a.kind, a2a.bytes, a2a.group, a2a.axes) == ("all-to-all", FULL, 2, ("expert",))
    [cp] = _read(mesh, lambda a: jax.lax.ppermute(a, "data", [(0, 1), (1, 0)]), P(), P(),
                 X).collectives
    assert (cp.kind, cp.bytes, cp.axes) == ("collective-permute", FULL, ("data",))

    def loop(a):
        return jax.lax.scan(lambda c, _: (jax.lax.psum(c, "data") * 0.5, None), a, None,
                            length=7)[0]
    [c] = _read(mesh, loop, P(), P(), X).collectives
    assert (c.kind, c.bytes, c.count) == ("all-reduce", FULL, 7)


def test_gspmd_replica_groups_name_the_mesh_axes(mesh):
    """A reduction over a dimension split on data+expert: GSPMD's own replica-group form."""
    x = jax.ShapeDtypeStruct((16, 128), jnp.float32)
    f = jax.jit(lambda a: a.sum(0), in_shardings=NamedSharding(mesh, P(("data", "expert"))),
                out_shardings=NamedSharding(mesh, P()))
    program = hlo.read(f.lower(x).compile().as_text(), SHAPE)
    assert {(c.kind, c.axes) for c in program.collectives} == {("all-reduce",
                                                               ("data", "expert"))}


def test_matmul_flops_count_loop_bodies_by_their_trip_count():
    w = jax.ShapeDtypeStruct((6, 256, 128), jnp.float32)
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32)

    def scanned(w, x):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi) @ wi.T, None), x, w)[0]
    compiled = jax.jit(scanned).lower(w, x).compile()
    per_layer = 2 * (2 * 64 * 256 * 128)
    assert hlo.read(compiled.as_text(), {"data": 1}).flops == 6 * per_layer
    assert compiled.cost_analysis()["flops"] < 2 * per_layer    # XLA counts the body once


def test_enumeration_prunes_and_keeps_one_of_each():
    sizes = search.Sizes(batch=16, heads=4, d_ff=64, vocab=128, experts=8)
    cands, pruned = search.enumerate_candidates(8, ("data", "model", "expert"), sizes)
    assert len(list(search.factorisations(8, 3))) == 10
    keys = [c.key() for c in cands]
    assert len(set(keys)) == len(keys) and pruned["same as another up to axis names"] > 0
    for c in cands:
        live = {a for a, n in c.mesh if n > 1}
        used = [a for _, axes in c.rules for a in axes]
        assert live == set(used)
        assert not set(c.axes("batch")) & set(c.axes("heads") + c.axes("d_ff") + c.axes("vocab"))
        for d in search.DIMS:
            assert sizes.of(d) % c.parts(d) == 0
    # the dp_mp_ep preset (up to axis names) is a candidate
    want = search.Candidate((("data", 2), ("model", 2), ("expert", 2)), (
        ("batch", ("data", "expert")), ("experts", ("expert",)), ("heads", ("model",)),
        ("d_ff", ("model",)), ("vocab", ("model",))))
    assert want.key() in set(keys)
    # heads 3 on 6 devices: model-parallel meshes over heads are indivisible
    _, pruned3 = search.enumerate_candidates(6, ("data", "model"), search.Sizes(6, 3, 6, 6, 0))
    assert pruned3["indivisible"] > 0


def test_cost_model_is_the_stated_textbook_formulas():
    p = hardware.get("tpu_v3")
    bw = p.ici_bytes_per_s
    c = lambda kind, n, hosts=False: hlo.Collective(kind, 2 ** 20, n, ("data",), hosts, 1)  # noqa
    assert p.seconds(c("all-reduce", 4)) == pytest.approx(2 * 3 / 4 * 2 ** 20 / bw)
    assert p.seconds(c("all-gather", 4)) == pytest.approx(3 / 4 * 2 ** 20 / bw)
    assert p.seconds(c("reduce-scatter", 4)) == pytest.approx(3 / 4 * 2 ** 20 / bw)
    assert p.seconds(c("all-to-all", 4)) == pytest.approx(3 / 4 * 2 ** 20 / bw)
    assert p.seconds(c("all-to-all", 1024)) == pytest.approx(1024 ** 0.5 / 8 * 2 ** 20 / bw)  # 2D torus bisection
    g = hardware.get("h100")                         # NVLink within a node, the NIC across
    assert g.seconds(c("all-reduce", 4, True)) == pytest.approx(1.5 * 2 ** 20 / g.dcn_bytes_per_s)
    assert g.seconds(c("all-to-all", 32)) == pytest.approx(31 / 32 * 2 ** 20 / g.ici_bytes_per_s)
    for prof in hardware.profiles().values():
        assert set(prof.sources) >= {"peak_flops", "hbm_bytes", "ici_bytes_per_s",
                                     "dcn_bytes_per_s"}


SMALL = ["--model", "switch_tiny", "--devices", "8", "--hardware", "tpu_v3",
         "--config", "configs/lm1b.py", "--length", "32", "--batch", "16", "--top", "2",
         "--no-scan", "--remat", "none", "--dtype", "float32"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small model's search on the test's 8 devices (the issue's one-minute case)."""
    import os
    before = os.environ.get("SWITCHZOO_CACHE")
    os.environ["SWITCHZOO_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    config = command.load_config("configs/lm1b.py")
    config.model, config.max_length, config.per_device_batch_size = "switch_tiny", 32, 2
    config.dtype, config.remat, config.scan_layers = "float32", "none", False
    lines = []
    try:
        result = search.search(config, hardware.get("tpu_v3"), 16 * 2 ** 30, top=2,
                               print_fn=lines.append)
        yield config, result, "\n".join(lines)
    finally:
        if before is None:
            os.environ.pop("SWITCHZOO_CACHE")
        else:
            os.environ["SWITCHZOO_CACHE"] = before


def test_small_search_table_and_winner(small):
    config, result, text = small
    assert result["compiled"] == 2 and result["winner"] is not None
    assert "pruned (axis used twice in one tensor)" in text and "winner: --config.mesh=" in text
    assert result["enumerated"] == result["estimated"] + sum(result["pruned"].values())
    steps = [r["step_ms"] for r in result["rows"]]
    assert steps == sorted(steps)
    for r in result["rows"]:
        assert r["step_ms"] == pytest.approx(r["compute_ms"] + r["communication_ms"])


def test_small_search_memory_equals_the_dry_run_and_collectives_the_hlo(small):
    config, result, _ = small
    w = result["winner"]
    case = config.copy_and_resolve_references()
    case.mesh, case.layout = w["mesh"], w["layout"]
    report = dry_run.run(case, print_fn=lambda *_: None)
    assert w["peak_bytes"] == report["memory"]["peak_estimate_bytes"]
    # unrolled layers: every collective runs once, so the counts are the inspector's
    assert w["counts"] == {k: report["collectives"][k] for k in hlo.KINDS}
    compiled, setup, _, _ = dry_run.compile_step(case)
    program = hlo.read(compiled.as_text(), dict(setup.layout.mesh.shape), 8)
    assert w["bytes"] == program.bytes_by_kind()
    assert w["flops"] == program.flops


def test_write_preset(small, tmp_path):
    _, result, _ = small
    path = search.write_preset("searched", result, tmp_path)
    text = path.read_text()
    assert result["winner"]["layout"] in text and result["winner"]["mesh"] in text
    with pytest.raises(LayoutError, match="exists"):
        search.write_preset("searched", result, tmp_path)
    assert path.read_text() == text


def test_budget_no_layout_meets_names_the_nearest_feasible(capsys):
    code = command.main(SMALL + ["--memory-gib", "0.0001"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert "no layout on 8 devices fits" in err and "16+ devices" in err
    assert "weight-update sharding" in err and "--config.remat=full" in err


@pytest.mark.parametrize("extra, message", [
    (["--hardware", "tpu_v9"], "unknown hardware profile 'tpu_v9'"),
    (["--fix", "modle:2"], "unknown mesh axis 'modle' (did you mean 'model'?)"),
    (["--batch", "12"], "--batch 12: no mesh of 8 devices splits 12 sequences evenly"),
    (["--fix", "model:3"], "--fix model:3: the pinned sizes do not divide 8 devices"),
    (["--axes", "data,data"], "give distinct axis names"),
])
def test_bad_input_is_one_line(capsys, extra, message):
    args = list(SMALL)
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    code = command.main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and message in err, err


def test_train_flags_read_only_with_search_layout():
    out = subprocess.run([sys.executable, "train.py", "--config=configs/lm1b.py",
                          "--hardware=tpu_v3", "--workdir=/nonexistent"], capture_output=True,
                         text=True)
    assert out.returncode == 2
    assert "--hardware is read only with --search_layout" in out.stderr
    out = subprocess.run([sys.executable, "train.py", "--config=configs/lm1b.py",
                          "--search_layout", "--devices=8"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0
    assert "--search_layout needs --hardware" in out.stderr
