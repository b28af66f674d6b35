"""Layout search over a pipeline's stage axis (issue 36; switchzoo/planner/candidates.py,
estimate.py, search.py): the enumeration of stage sizes and micro-batches; the estimate's
pipeline terms against hand counts (state and FLOPs per stage, the bubble, the sends, the
last stage's all-reduce, a circular schedule's re-layout); "is PP x EP x DP better than EP x MP
x DP?" where the cost model knows the answer; one small search that compiles a pipelined
candidate and reads its collective-permutes."""
import dataclasses
import math

import pytest

from switchzoo import zoo
from switchzoo.layout import LayoutError
from switchzoo.planner import advice, command, estimate, from_config, hardware, search

AXES = ("stage", "data", "model", "expert")


def test_microbatches_4_per_stage_or_what_the_batch_allows():
    f = search.microbatches_for
    assert f(64, 2, 4) == 8                        # 4 x stages
    assert f(32, 4, 4) == 8                        # 16 leaves 2 rows for 4 batch shards
    assert f(32, 4, 1, requested=32) == 32
    assert f(32, 4, 4, requested=16) is None       # 2 rows per micro-batch over 4 shards
    assert f(32, 4, 1, requested=2, repeats=2) is None     # circular: M >= S
    assert f(6, 4, 4) is None


def test_enumeration_pipelines_only_over_the_stage_axis():
    sizes = search.Sizes(batch=32, heads=4, d_ff=64, vocab=128, experts=8, groups=(6, 6))
    cands, pruned = search.enumerate_candidates(8, AXES, sizes)
    staged = [c for c in cands if c.stages > 1]
    assert {c.stages for c in staged} == {2}       # 4 and 8 do not divide 6 groups
    assert pruned["stages not dividing the layer groups"] > 0
    for c in cands:
        size = dict(c.mesh)["stage"]
        assert c.stages == size and (c.axes("layers") == ("stage",)) == (size > 1)
        assert all("stage" not in a for d, a in c.rules if d != "layers")
        if size > 1:
            assert "layers:stage" in c.layout_text and c.repeats == 1
            assert c.microbatches == search.microbatches_for(32, size, c.parts("batch"))
            assert c.iterations == c.microbatches + size - 1
        else:
            assert c.microbatches == 0 and c.bubble == 1.0
    # without the stage axis (the default) nothing is pipelined, and the candidates are the
    # stage axis's size-1 ones, so results without --axes stage are unchanged
    plain, plain_pruned = search.enumerate_candidates(8, AXES[1:], sizes)
    assert "stages not dividing the layer groups" not in plain_pruned
    assert {c.key() for c in plain} == {c.key() for c in cands if c.stages == 1}
    # micro-batches asked for: 3 does not divide 32 sequences, so no pipeline is left
    odd, _ = search.enumerate_candidates(8, AXES, sizes, microbatches=3)
    assert odd and all(c.stages == 1 for c in odd)
    # a circular schedule needs stages x repeats to divide the groups: 2 x 2 does not divide 6
    circ, _ = search.enumerate_candidates(8, AXES, sizes, repeats=2)
    assert all(c.stages == 1 for c in circ)


def _model(name="switch_tiny", layers=8, batch=64, length=32, remat="none", **kw):
    """The estimate's view of a scanned catalogue model (``layers`` per stack)."""
    cfg = zoo.get(name).replace(scan_layers=True, num_layers=layers, remat=remat)
    weights, _ = from_config.weights_of(cfg)
    return estimate.Model(cfg, weights, estimate.stacks_of(cfg, (length,), batch), 1.0, False,
                          batch, 4, remat, groups=(layers // 2,), **kw)


def _pipe(model, mesh, **rules):
    c = search.Candidate(tuple(mesh), tuple((d, rules.get(d, ())) for d in search.DIMS)
                         + (("layers", ("stage",)),))
    return model.pipelined(c)


def test_estimate_prices_the_pipeline_as_stated():
    """switch_tiny with 8 layers (4 scanned groups), 64 sequences of 32 tokens, float32, on
    stage:4 x data:4 (16 devices, 8 per host: the stage axis outermost crosses hosts): M = 16
    micro-batches of one row per device, I = 16 + 3 = 19 iterations, bubble f = 19 / 16."""
    h100 = hardware.get("h100")
    model = _model()
    pp = _pipe(model, (("stage", 4), ("data", 4)), batch=("data",))
    flat = dataclasses.replace(pp, rules=pp.rules[:-1], microbatches=0)   # same, no pipeline
    S, M, f = 4, 16, 19 / 16
    assert (pp.stages, pp.microbatches, pp.iterations, pp.bubble) == (S, M, 19, f)
    stacked = sum(w.elements for w in model.weights if "layers" in w.dims)
    other = sum(w.elements for w in model.weights if "layers" not in w.dims)
    # state: parameters, gradients and (here 1 x) optimizer state, float32; the stage holds a
    # quarter of the stacked layers and all the rest
    assert model.state_bytes(pp) == int(3 * 4 * (stacked / S + other))
    assert model.state_bytes(flat) == int(3 * 4 * (stacked + other))
    # FLOPs: the layers' are / S x f (each device runs its stage for I iterations, the bubble
    # on dummy data); the output layer's are every stage's
    out = sum(2 * w.elements * 16 * 32 for w in model.weights if w.role == "output")
    assert model.forward_flops(pp, True) - out == pytest.approx(
        (model.forward_flops(flat, True) - out) * f / S, rel=1e-9)
    # collectives on the stage axis, per iteration: the hand-over of one micro-batch (a row
    # of 32 x 64 x 4 bytes per device), forward and its gradient back (two permutes), with
    # the masks travelling forward (32 x (32 + 1) bytes); the last stage's output all-reduced
    # (forward) and the stage-0 input's gradient (backward)
    x, rows = 32 * 64 * 4, 32 * 33
    by = {(c.kind, c.axes): c for c in model.collectives(pp, h100)}
    cp, ar = by[("collective-permute", ("stage",))], by[("all-reduce", ("stage",))]
    assert cp.count == 3 * 19 and cp.bytes * cp.count == pytest.approx(19 * (3 * x + rows), 1e-6)
    assert ar.count == 2 * 19 and ar.bytes == x
    assert cp.crosses_hosts and ar.crosses_hosts                       # 4 hosts, one a stage
    assert h100.seconds(cp, pp.mesh) == pytest.approx(cp.bytes / h100.dcn_bytes_per_s)
    assert not by[("all-reduce", ("data",))].crosses_hosts             # gradients: in a host
    assert not any(k == "all-to-all" for k, _ in by)                   # GPipe: no re-layout
    # the step: compute x f / S, plus the stage's sends and all-reduces
    assert model.step_seconds(pp, h100) > model.program(pp, h100).flops / h100.peak_flops
    # circular (R = 2; 16 layers = 8 groups = 4 stages x 2 rounds): the bubble shrinks to
    # (S - 1) / (R M + S - 1), and each stacked parameter (and its gradient) crosses the stage
    # axis once per step by an all-to-all
    model2 = _model(layers=16, pipeline_repeats=2)
    circ = _pipe(model2, (("stage", 4), ("data", 4)), batch=("data",))
    assert (circ.repeats, circ.iterations) == (2, 2 * 16 + 3) and circ.bubble < f
    a2a = {(c.kind, c.axes): c for c in model2.collectives(circ, h100)}[
        ("all-to-all", ("stage",))]
    stacked2 = sum(w.elements for w in model2.weights if "layers" in w.dims)
    assert a2a.bytes * a2a.count == pytest.approx(2 * 4 * stacked2 / S, rel=1e-9)
    # activations: the stage's share of the saved layer inputs, for every micro-batch in
    # flight (x f), are fewer than the unpipelined step's; more micro-batches, fewer still
    full = _model(remat="full")
    assert full.activation_bytes(_pipe(full, pp.mesh, batch=("data",))) < \
        full.activation_bytes(flat)
    fewer = dataclasses.replace(full, pipeline_microbatches=4)
    assert fewer.activation_bytes(_pipe(fewer, pp.mesh, batch=("data",))) > \
        full.activation_bytes(_pipe(full, pp.mesh, batch=("data",)))
    # the advice keeps a pipeline's micro-batches when it weighs more devices
    more = advice.changes(full, _pipe(full, pp.mesh, batch=("data",)),
                          0.5 * full.state_bytes(pp), 16)
    assert all(ch.cand.stages == 1 or ch.cand.microbatches > 0 for ch in more)


def _search_model(argv):
    """The search's estimate of the run the command's flags ``argv`` give."""
    from switchzoo import state as state_lib
    args = command.parser().parse_args(argv)
    config = command.config_from_args(args)
    return from_config.analytic_model(config, search.run_model(config),
                                   state_lib.run_optimizer(config), args.devices)


def _best(model, n, profile):
    """The search's estimated ranking (step 3) of every candidate estimated to fit: the
    winner, the fastest pipelined and the fastest unpipelined one."""
    cands, _ = search.enumerate_candidates(n, AXES, model.sizes(),
                                           ordered=not profile.ici_spans_hosts)
    fitting, _ = search.estimate_candidates(model, cands, profile, profile.hbm_bytes)
    return (fitting[0], next(e for e in fitting if e[0].stages > 1),
            next(e for e in fitting if e[0].stages == 1))


def test_pipeline_wins_where_the_state_does_not_fit_a_host_and_hosts_are_far_apart():
    """Switch-XXL with 64 experts (201B parameters: 1.6 TB of float32 parameters and gradients,
    a DGX H100 holds 640 GB) on 64 H100s (8 DGXs), 256 sequences. Without a pipeline the state
    has to be split over an axis that spans hosts, so per-layer collectives (expert
    all-to-alls, model all-reduces, or a replicated expert's gradient all-reduce) cross the
    50 GB/s network; a stage axis outermost puts a stage in each pair of DGXs, so the expert
    traffic stays on NVLink and what crosses is a micro-batch's activations (and the model
    axis's all-reduces, over the pair). The search ranks
    that pipeline first by more than 1.5x, and on an all-NVLink network the margin mostly goes.
    On 32 H100s no pipeline fits: a stage's loop accumulates its weights' gradients beside
    them (compiled: 144 GiB a device; docs/layout_search_pipeline.md)."""
    h100 = hardware.get("h100")
    small = _search_model(["--model", "switch_xxl", "--devices", "32", "--hardware", "h100",
                           "--batch", "256"])
    was_best = small.pipelined(search.Candidate(       # before the loop's gradients were priced
        (("stage", 4), ("data", 2), ("model", 1), ("expert", 4)),
        (("batch", ("data", "expert")), ("experts", ("data", "expert")), ("layers", ("stage",)))))
    assert small.state_bytes(was_best) + small.activation_bytes(was_best) > h100.hbm_bytes
    model = _search_model(["--model", "switch_xxl", "--devices", "64", "--hardware", "h100",
                           "--batch", "256"])
    assert model.state_bytes(search.Candidate((("data", 8),), ())) > 8 * h100.hbm_bytes
    top, pp, flat = _best(model, 64, h100)
    assert top is pp and pp[0].mesh[0] == ("stage", 4)
    assert flat[3] > 1.5 * pp[3]
    crossing = [c for c in model.collectives(pp[0], h100) if c.crosses_hosts]
    assert crossing and all(c.kind != "all-to-all" for c in crossing)   # experts: in a DGX
    assert any(c.kind == "all-to-all" and not c.crosses_hosts
               for c in model.collectives(pp[0], h100))
    assert any(c.crosses_hosts and c.count > 1 for c in model.collectives(flat[0], h100))
    fast = dataclasses.replace(h100, ici_spans_hosts=True)            # every link NVLink
    assert model.step_seconds(flat[0], fast) < 1.25 * model.step_seconds(pp[0], fast)


def test_no_pipeline_where_the_model_fits_and_the_network_is_fast():
    """Switch-Base-128 on 32 TPU v3 cores (the paper's Table 1 setting: 256 sequences; a
    slice is all ICI): the best layout is data + expert parallelism without a pipeline. A
    pipeline saves little communication there, and its bubble ((S-1)/M of the stage's compute,
    plus the output layer on every stage) costs more."""
    tpu = hardware.get("tpu_v3")
    model = _search_model(["--model", "switch_base_128", "--devices", "32", "--hardware",
                           "tpu_v3"])
    top, pp, flat = _best(model, 32, tpu)
    assert top is flat and pp[3] > flat[3]
    cost = lambda e: hardware.step_cost(model.program(e[0], tpu), tpu, e[0].mesh)  # noqa
    assert cost(pp).compute_s - cost(flat).compute_s > \
        cost(flat).communication_s - cost(pp).communication_s


SMALL = ["--model", "switch_tiny", "--devices", "8", "--hardware", "h100", "--config",
         "configs/lm1b.py", "--length", "32", "--batch", "16", "--top", "1", "--remat", "none",
         "--dtype", "float32", "--axes", "stage,data,expert", "--fix",
         "stage:2,data:2,expert:2", "--microbatches", "4"]
# 4 devices per host: the stage axis (outermost) crosses hosts, data x expert is one host;
# a slow chip, so that compute ranks the tiny model's layouts (the layout that splits the work)
PROFILE = dataclasses.replace(hardware.get("h100"), devices_per_host=4, peak_flops=1e9)


def test_search_compiles_a_pipeline_and_prices_its_sends(tmp_path, monkeypatch):
    """One small search (one compile): the candidate it compiles is pipelined (scanned
    layers, 4 micro-batches), and the compiled program's collective-permutes, their bytes and
    its all-reduces over the stage axis are the estimate's; its FLOPs (the bubble included in
    the loop's trip counts) are the estimate's to 0.1%."""
    monkeypatch.setenv("SWITCHZOO_CACHE", str(tmp_path))
    args = command.parser().parse_args(SMALL)
    config = command.config_from_args(args)
    axes = tuple(args.axes.split(","))
    lines = []
    result = search.search(config, PROFILE, 16 * 2 ** 30, axes, command.parse_fixed(
        args.fix, axes), top=1, print_fn=lines.append)
    [row] = result["rows"]
    assert (row["stages"], row["microbatches"], row["repeats"]) == (2, 4, 1)
    assert row["layout"] == "batch:data+expert,experts:data+expert,layers:stage"
    text = "\n".join(lines)
    assert "S,M,R" in text and "--config.pipeline_microbatches=4" in text
    assert "--config.scan_layers=true" in text
    cand = search.parse_include(f"{row['mesh']}/{row['layout']}", axes, 8)
    model = _search_model(SMALL)
    measured = search.measure(config, model.pipelined(cand), PROFILE)
    assert measured["cached"]
    compiled = search.program_of(measured)
    estimated = model.program(model.pipelined(cand), PROFILE)
    on_stage = lambda p, kind: [c for c in p.collectives  # noqa: E731
                                if c.kind == kind and c.axes == ("stage",)]
    cps = on_stage(compiled, "collective-permute")
    assert cps and all(c.crosses_hosts for c in cps)
    assert [c.kind for c in compiled.collectives if c.kind == "collective-permute"
            and c.axes != ("stage",)] == []
    total = lambda cs: sum(c.bytes * c.count for c in cs)  # noqa: E731
    # the compiled permutes add only the step's random keys (two u32[1, 2]: 16 bytes)
    assert 0 <= total(cps) - total(on_stage(estimated, "collective-permute")) <= 16
    assert row["bytes"]["collective-permute"] == total(cps) > 0
    big = lambda cs: [(c.bytes, c.count) for c in cs if c.count > 1]  # noqa: E731
    assert big(on_stage(compiled, "all-reduce")) == big(on_stage(estimated, "all-reduce"))
    assert estimated.flops == pytest.approx(compiled.flops, rel=1e-3)
    a2a = {(c.axes, c.crosses_hosts) for c in compiled.collectives if c.kind == "all-to-all"}
    assert a2a == {(("data", "expert"), False)}                     # experts: in a host
    assert row["communication_ms_by_kind"]["collective-permute"] == pytest.approx(
        1e3 * sum(c.count * PROFILE.seconds(c, cand.mesh) for c in cps))


@pytest.mark.parametrize("extra, message", [
    (["--microbatches", "8"], "--microbatches / --repeats are read only with a pipeline"),
    (["--axes", "stage,data", "--no-scan"], "the 'stage' axis pipelines scanned layers"),
    (["--axes", "stage,data", "--include", "stage:4,data:2/batch:data,layers:stage"],
     "4 stages x 1 repeats do not divide the 2 layer groups"),
])
def test_bad_pipeline_requests_are_one_line(capsys, extra, message):
    argv = ["--model", "switch_tiny", "--devices", "8", "--hardware", "h100", "--config",
            "configs/lm1b.py", "--length", "32", "--batch", "16", *extra]
    assert command.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err


def test_include_of_a_pipeline_is_checked_before_compiling():
    model = _model(layers=4)
    bad = search.parse_include("stage:2,data:4/batch:data,heads:stage,layers:stage",
                               ("stage", "data"), 8)
    with pytest.raises(LayoutError, match="carries nothing else"):
        search._pipelined_include("x", bad, model)
    good = search._pipelined_include("x", search.parse_include(
        "stage:2,data:4/batch:data,layers:stage", ("stage", "data"), 8), model)
    assert (good.stages, good.microbatches) == (2, 8) and math.isclose(good.bubble, 9 / 8)


def test_estimate_reduces_a_stages_gradients_once_where_it_runs_per_batch_shard():
    """dp_pp_ep's rules with data > 1 (batch over data+expert, experts over the trailing
    expert axis) run each stage per batch shard: the all-reduce of the stacked weights'
    gradients once a step. With the experts over the batch's axes in another order the stages
    run unsharded and it is charged in every iteration (I = M + 1 = 9 at 2 stages)."""
    h100 = hardware.get("h100")
    model = _model()
    mesh = (("stage", 2), ("data", 2), ("expert", 2))
    # the weights split over neither batch axis: the stage's half of the stacked ones, all of
    # the others, float32
    stacked = sum(2 * w.elements for w in model.weights
                  if "layers" in w.dims and "experts" not in w.dims)
    other = sum(4 * w.elements for w in model.weights if "layers" not in w.dims)
    for experts, times in ((("expert",), 1), (("expert", "data"), 9)):
        pp = _pipe(model, mesh, batch=("data", "expert"), experts=experts)
        assert pp.iterations == 9
        by = {(c.kind, c.axes): c for c in model.collectives(pp, h100)}
        ar = by[("all-reduce", ("data", "expert"))]
        assert ar.bytes * ar.count == pytest.approx(times * stacked + other, rel=1e-9)
