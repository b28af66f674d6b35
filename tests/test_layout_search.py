"""Layout search (switchzoo/layout/): the HLO reading against programs whose collectives and
FLOPs are known; the estimate against a hand count, known bandwidth ratios and a compiled
program; the enumeration and its pruning; a small search end to end; advice that the search
itself finds feasible once applied; bad input."""
import dataclasses
import math
import re
import shlex
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from switchzoo import zoo
from switchzoo.layout import LayoutError
from switchzoo.planner import advice, command, estimate, from_config, hardware, hlo, search

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


def _tiny(name="switch_base_tiny", lengths=(32, 8), batch=1, **moe):
    """The estimate's view of a catalogue model, without a run config."""
    cfg = zoo.get(name)
    if moe:
        cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, **moe))
    weights, _ = from_config.weights_of(cfg)
    return estimate.Model(cfg, weights, estimate.stacks_of(cfg, lengths, batch), 1.0, False,
                          batch, 4, "none")


def test_model_flops_count_each_stack_at_its_length_and_experts_by_served_slots():
    """A hand count: switch_base_tiny (d_model 64, 4 heads x 16, d_ff 128, 4 experts, 2+2
    layers, layer 1 of each stack sparse, tied vocab 256) with top-2, one sequence of 32
    input and 8 target tokens. Forward FLOPs:
      encoder (32 tokens, one group of 32: capacity round(32 x 1.25 / 4) = 10 slots x 4
      experts = 40 slots, fewer than the 64 picks):
        projections q k v o   2 x 4 x 64 x 64 x 32 tokens x 2 layers    = 2,097,152
        scores + values       4 x 32 x 32 x 64 x 2 layers                =   524,288
        dense FFN (layer 0)   2 x 2 x 64 x 128 x 32                      = 1,048,576
        router                2 x 64 x 4 x 32                            =    16,384
        experts, 40 slots     2 x 2 x 64 x 128 x 40                      = 1,310,720
      decoder (8 tokens, one group of 8: capacity max(round(2.5), 4) = 4 x 4 = 16 slots,
      every one of the 16 picks served):
        self q k v o          2 x 4 x 64 x 64 x 8 x 2                    =   524,288
        self scores           4 x 8 x 8 x 64 x 2                         =    32,768
        cross q o (targets)   2 x 2 x 64 x 64 x 8 x 2                    =   262,144
        cross k v (inputs)    2 x 2 x 64 x 64 x 32 x 2                   = 1,048,576
        cross scores          4 x 8 x 32 x 64 x 2                        =   131,072
        dense FFN             2 x 2 x 64 x 128 x 8                       =   262,144
        router                2 x 64 x 4 x 8                             =     4,096
        experts, 16 slots     2 x 2 x 64 x 128 x 16                      =   524,288
        output layer          2 x 64 x 256 x 8                           =   262,144
    = 8,048,640 forward, x 3 for training."""
    model = _tiny(top_k=2)
    assert model.forward_flops() == 8_048_640
    assert model.model_flops == 3 * 8_048_640
    # the capacity dispatch computes every slot (here all served) and the combine's
    # gate-weighted sum, 2 x top_k x d_model per token: (32 + 8) x 2 x 2 x 64 = 10,240
    assert model.forward_flops(computed=True) - model.forward_flops() == 10_240
    # one-hot einsum masks instead: GND,GNEC->EGCD and back, 2 x N x E x C x d_model each:
    # encoder 2 x 2 x 32 x 40 x 64 = 327,680; decoder 2 x 2 x 8 x 16 x 64 = 32,768
    einsum = _tiny(top_k=2, dispatch="einsum")
    assert einsum.forward_flops(computed=True) - einsum.forward_flops() == 327_680 + 32_768


def _cand(mesh, **rules):
    return search.Candidate(tuple(mesh), tuple((d, rules.get(d, ())) for d in search.DIMS))


def test_the_same_all_to_all_within_and_across_hosts():
    """Expert parallelism over 8 H100s: inner mesh axis (one DGX) or outer (one GPU in each
    of 8 DGXs: every group crosses the network). The all-to-all's estimated time differs by
    exactly the profile's NVLink / network bandwidth ratio."""
    h100 = hardware.get("h100")
    model = _tiny("switch_tiny", lengths=(32,), batch=32)
    inner = _cand((("data", 4), ("expert", 8)), batch=("data", "expert"), experts=("expert",))
    outer = _cand((("expert", 8), ("data", 4)), batch=("expert", "data"), experts=("expert",))

    def seconds(c, kind):
        return sum(x.count * h100.seconds(x, c.mesh) for x in model.collectives(c, h100)
                   if x.kind == kind)
    assert seconds(outer, "all-to-all") / seconds(inner, "all-to-all") == pytest.approx(
        h100.ici_bytes_per_s / h100.dcn_bytes_per_s)                        # 9x


def test_tpu_v3_cores_of_a_chip_share_its_links():
    """Cores 2k and 2k+1 are one v3 chip. An all-reduce over the inner axis keeps a chip's
    two cores in one ring (the ring's stream uses the chip's links once); over an outer axis
    of the same size each core is in its own ring over the same links: half the bandwidth
    each. A v4 chip is one device, so there the axis does not matter."""
    mesh = (("data", 4), ("model", 4))
    ar = lambda axis: hlo.Collective("all-reduce", 2 ** 20, 4, (axis,), False, 1)  # noqa
    for key, ratio in (("tpu_v3", 2.0), ("tpu_v4", 1.0)):
        p = hardware.get(key)
        assert p.seconds(ar("data"), mesh) / p.seconds(ar("model"), mesh) == pytest.approx(ratio)
    for prof in hardware.profiles().values():
        assert set(prof.sources) >= {"peak_flops", "hbm_bytes", "ici_bytes_per_s",
                                     "dcn_bytes_per_s"}


SMALL = ["--model", "switch_tiny", "--devices", "8", "--hardware", "tpu_v3",
         "--config", "configs/lm1b.py", "--length", "32", "--batch", "16", "--top", "2",
         "--no-scan", "--remat", "none", "--dtype", "float32"]
EXPERTS = "data:4,model:1,expert:2/batch:data+expert,experts:expert"
# 2 devices per host: the expert axis stays in a host, the data axis crosses hosts
PROFILE = dataclasses.replace(hardware.get("tpu_v3"), devices_per_host=2)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small model's search on the test's 8 devices (the issue's one-minute case), with an
    expert-parallel layout compiled beside the search's best."""
    import os
    before = os.environ.get("SWITCHZOO_CACHE")
    os.environ["SWITCHZOO_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    config = command.config_from_args(command.parser().parse_args(SMALL))
    lines = []
    try:
        result = search.search(config, PROFILE, 16 * 2 ** 30, top=1, print_fn=lines.append,
                               include=[EXPERTS])
        yield config, result, "\n".join(lines)
    finally:
        if before is None:
            os.environ.pop("SWITCHZOO_CACHE")
        else:
            os.environ["SWITCHZOO_CACHE"] = before


def _model(args):
    from switchzoo import state as state_lib
    config = command.config_from_args(args)
    return from_config.analytic_model(config, search.run_model(config),
                                   state_lib.run_optimizer(config), args.devices)


def test_small_search_table_and_winner(small):
    _, result, text = small
    assert result["compiled"] == 2 and result["winner"] is not None
    assert sum(r["included"] for r in result["rows"]) == 1
    assert "pruned (axis used twice in one tensor)" in text and "winner: --config.mesh=" in text


def test_estimate_against_the_compiled_program(small):
    """The estimate's matmul FLOPs per device and its all-to-alls (mesh axes, host crossing,
    bytes) against the compiled train step's HLO (read from the search's cache: no compile)."""
    config, _, _ = small
    cand = search.parse_include(EXPERTS, ("data", "model", "expert"), 8)
    measured = search.measure(config, cand, PROFILE)
    assert measured["cached"]
    compiled = search.program_of(measured)
    estimated = _model(command.parser().parse_args(SMALL)).program(cand, PROFILE)
    assert estimated.flops == pytest.approx(compiled.flops, rel=1e-3)
    a2a = lambda p: {(c.axes, c.crosses_hosts) for c in p.collectives  # noqa: E731
                     if c.kind == "all-to-all"}
    assert a2a(estimated) == a2a(compiled) == {(("expert",), False)}
    assert estimated.bytes_by_kind()["all-to-all"] == compiled.bytes_by_kind()["all-to-all"]
    assert {c.axes for c in estimated.collectives if c.crosses_hosts} <= {
        c.axes for c in compiled.collectives if c.crosses_hosts}


def test_write_preset(small, tmp_path):
    _, result, _ = small
    path = search.write_preset("searched", result, tmp_path)
    text = path.read_text()
    assert result["winner"]["layout"] in text and result["winner"]["mesh"] in text
    with pytest.raises(LayoutError, match="exists"):
        search.write_preset("searched", result, tmp_path)
    assert path.read_text() == text


def _pieces(line: str) -> list[list[str]]:
    """The advice's flags: 'estimated to fit: FLAGS (...); FLAGS (...)' -> [[flag, value..]]."""
    assert "estimated to fit: " in line, line
    return [shlex.split(piece.split(" (")[0])
            for piece in line.split("estimated to fit: ")[1].split("; ")]


def _with(argv: list[str], piece: list[str]) -> list[str]:
    out = list(argv)
    for flag, value in zip(piece[::2], piece[1::2]):
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def test_advice_when_no_state_fits_is_checked_by_the_search(capsys):
    """Under a budget no layout's state meets on 8 devices, each piece of advice, applied to
    the command's own flags, gives a run where the search keeps a layout (its pruning check)."""
    budget = 3 * 2 ** 20                  # switch_tiny's smallest state on 8 devices: 3.6 MiB
    argv = SMALL + ["--memory-gib", str(budget / 2 ** 30)]
    assert command.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no layout on 8 devices fits" in err
    assert "--config." not in err and "shard_optimizer" not in err
    pieces = _pieces(err)
    assert pieces and all(p[0] != "--remat" and p[0] != "--dtype" for p in pieces)
    for piece in pieces:
        args = command.parser().parse_args(_with(argv, piece))
        model = _model(args)
        sizes = search.Sizes(model.batch, model.cfg.num_heads, model.cfg.d_ff,
                             model.cfg.vocab_size, model.cfg.moe.num_experts)
        cands, _ = search.enumerate_candidates(args.devices, ("data", "model", "expert"),
                                               sizes, ordered=False)
        assert any(search.state_fits(model.state_bytes(c), budget) for c in cands), piece


def test_advice_after_compiling_is_checked_by_the_search(small):
    """Under a budget below every compiled peak, each piece of advice (this command's flags),
    applied and rebuilt from the flags, is estimated to fit by the search's own check; and
    train.py's spelling names config fields that exist."""
    config, result, _ = small
    low = min(result["rows"], key=lambda r: r["peak_bytes"])
    cand = search.parse_include(f"{low['mesh']}/{low['layout']}", ("data", "model", "expert"), 8)
    budget = 0.8 * low["peak_bytes"]
    base = _model(command.parser().parse_args(SMALL))
    line = advice.advise(base, cand, budget, 8, low["peak_bytes"], "search")
    pieces = _pieces(line)
    assert pieces
    for piece, change in zip(pieces, advice.changes(base, cand, budget, 8, low["peak_bytes"])):
        changed = _model(command.parser().parse_args(_with(SMALL, piece)))
        assert advice.estimated_peak(base, cand, low["peak_bytes"], changed,
                                     change.cand) <= budget, piece
    for flag in advice.FLAGS["train"].values():
        for key in re.findall(r"--config\.(\w+)=", flag):
            assert key in config, flag


@pytest.mark.parametrize("extra, message", [
    (["--hardware", "tpu_v9"], "unknown hardware profile 'tpu_v9'"),
    (["--fix", "modle:2"], "unknown mesh axis 'modle' (did you mean 'model'?)"),
    (["--batch", "12"], "--batch 12: no mesh of 8 devices splits 12 sequences evenly"),
    (["--fix", "model:3"], "--fix model:3: the pinned sizes do not divide 8 devices"),
    (["--axes", "data,data"], "give distinct axis names"),
    (["--config", "configs/c4.py"], "give --config configs/lm1b.py, or an encoder-decoder "
                                    "--model such as switch_base_8"),
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
    assert "--config." not in err                  # the command takes no --config.X flags


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
