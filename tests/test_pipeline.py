"""Pipeline parallelism (switchzoo/pipeline.py): a pipelined train step computes the unpipelined
step's loss, metrics and gradients (fp32, rtol 1e-5) on 8 simulated devices, GPipe and circular,
decoder-only and encoder-decoder, with Switch layers; the compiled program hands activations
between stages by collective-permute and never gathers a whole stack; bad settings are refused
in one line."""
import dataclasses
import json

import jax
import numpy as np
import pytest

from switchzoo import inspector, layout as L, loop, pipeline, state as state_lib, steps, weights
from switchzoo import zoo
from switchzoo.configs import mini
from switchzoo.planner import hlo

from test_mesh_equivalence import BATCH, TX, assert_close, one_step


def model(name: str, layers: int, **kw):
    """``name`` with ``layers`` per stack (two scanned (dense, Switch) groups per 4 layers),
    without router jitter (its noise is drawn per micro-batch)."""
    cfg = zoo.get(name)
    stacks = {"num_layers": layers}
    if cfg.is_encoder_decoder:
        stacks["num_encoder_layers"] = layers
    return cfg.replace(**{"scan_layers": True, "moe": dataclasses.replace(cfg.moe, jitter=0.0),
                          **stacks, **kw})


@pytest.fixture(scope="module")
def lm():
    """switch_tiny with a dispatch, and its unpipelined step on one device (once each)."""
    done = {}

    def get(dispatch):
        if dispatch not in done:
            cfg = model("switch_tiny", 8)
            cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, dispatch=dispatch))
            done[dispatch] = cfg, one_step(L.make_mesh("data:1", devices=jax.devices()[:1]),
                                           "data_parallel", cfg)
        return done[dispatch]
    return get


# Each stage runs per batch shard: experts cut over the shards (expert parallelism over the
# batch's axes: all_to_all inside the stage) or copied (experts on another axis: the
# encoder-decoder test); or unsharded, where an expert weight is split over the batch's axis
# otherwise (here its d_ff: the weights' gradients are then reduced in every iteration).
@pytest.mark.parametrize("mesh, layout, microbatches, repeats, dispatch, per_shard", [
    ("stage:2,data:2,expert:2", "batch:data+expert,experts:expert,layers:stage", 4, 1,
     "auto", True),           # dp_pp_ep's: each expert shard its experts, copied over data
    ("stage:4,data:2", "batch:data,d_ff:data,layers:stage", 4, 1, "auto", False),
    ("stage:2,data:4", "batch:data,experts:data,layers:stage", 2, 2, "dropless", True),
])
def test_decoder_only_step_equals_unpipelined(lm, mesh, layout, microbatches, repeats,
                                              dispatch, per_shard):
    cfg, reference = lm(dispatch)
    cfg = cfg.replace(pipeline_microbatches=microbatches, pipeline_repeats=repeats)
    setup = state_lib.setup(cfg, L.Layout.create(layout, L.make_mesh(mesh)), optimizer=TX)
    step = steps.make_train_step(setup).lower(
        setup.abstract, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), BATCH)
    ).compile()
    got = one_step(setup.mesh, layout, cfg, step)
    assert_close(got[0], reference[0], "metrics")
    assert_close(got[1], reference[1], "gradient")
    # Stages hand activations over by collective-permute; nothing gathers a stacked parameter
    # over the stage axis (each stage keeps its own layers).
    program = hlo.read(step.as_text(), dict(setup.mesh.shape))
    over_stages = [c for c in program.collectives if "stage" in c.axes]
    assert any(c.kind == "collective-permute" for c in over_stages)
    stacked = [x.size * x.dtype.itemsize for path, x in jax.tree_util.tree_leaves_with_path(
        setup.abstract.params) if "scanned" in state_lib.path_name(path)]
    assert all(c.bytes < min(stacked) for c in over_stages if c.kind == "all-gather")
    # Per shard, the weights' gradients are summed over the batch shards once a step, after
    # the loop; unsharded, in every iteration of it.
    batch_axes = set(setup.layout.axes("batch"))
    iterations = pipeline.plan(setup.layout, cfg).iterations
    assert any(c.kind == "all-reduce" and set(c.axes) & batch_axes and c.count >= iterations
               for c in program.collectives) is not per_shard
    # Experts cut over batch axes are reached by all-to-all over those axes alone.
    experts = set(setup.layout.axes("experts"))
    if per_shard and experts <= batch_axes:
        assert any(c.kind == "all-to-all" and set(c.axes) == experts
                   for c in program.collectives)


def test_encoder_decoder_step_equals_unpipelined():
    cfg = model("switch_base_tiny", 4, remat="full")
    reference = one_step(L.make_mesh("data:1", devices=jax.devices()[:1]), "data_parallel", cfg)
    # the experts cut over the batch's leading axis (expert), copied over data: two vmaps
    got = one_step(L.make_mesh("stage:2,data:2,expert:2"),
                   "batch:expert+data,experts:expert,layers:stage",
                   cfg.replace(pipeline_microbatches=2), init=True)     # drawn on the stages
    assert_close(got[0], reference[0], "metrics")
    assert_close(got[1], reference[1], "gradient")


@pytest.mark.parametrize("mesh, layout, per_shard, line", [
    ("stage:2,data:2,expert:2", "batch:data+expert,experts:data+expert,layers:stage",
     {"axes": ["data", "expert"], "shards": 4, "experts": "cut",
      "experts_over": ["data", "expert"]}, "each shard its own experts"),
    ("stage:2,data:1,expert:4", "dp_pp_ep",            # axes of size 1 split nothing
     {"axes": ["expert"], "shards": 4, "experts": "cut", "experts_over": ["expert"]},
     "each shard its own experts"),
    ("stage:2,data:2,expert:2", "dp_pp_ep",            # experts over the batch's trailing axis
     {"axes": ["data", "expert"], "shards": 4, "experts": "cut", "experts_over": ["expert"]},
     "each shard of expert its own experts"),
    ("stage:2,data:2,expert:2", "batch:expert+data,experts:expert,layers:stage",  # leading
     {"axes": ["expert", "data"], "shards": 4, "experts": "cut", "experts_over": ["expert"]},
     "each shard of expert its own experts"),
    ("stage:2,data:2,expert:2", "batch:data,experts:expert,layers:stage",
     {"axes": ["data"], "shards": 2, "experts": "copied", "experts_over": []},
     "a copy of the stage's weights"),
    ("stage:2,data:2,expert:2", "batch:data+expert,experts:expert+data,layers:stage", None,
     "runs unsharded"),                                 # the batch's axes in another order
])
def test_the_inspector_says_how_each_stage_runs_per_batch_shard(mesh, layout, per_shard, line):
    report = inspector.inspect("switch_tiny", mesh, layout,
                               compile_step=False, scan_layers=True, microbatches=2)
    assert report["pipeline"]["per_shard"] == per_shard
    assert line in inspector.format_table(report)


def run_config(**kw):
    c = mini.get_config("model=switch_tiny,steps=4")
    c.per_device_batch_size, c.max_length, c.data.vocab_size = 1, 32, 300
    c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps = 1, 0, 4
    c.data.max_eval_examples = 16
    c.data.embedded_max_pairs = 500     # a quick tokenizer (all 52k: ~10 s of sentencepiece)
    c.data.locale_dir = "/nonexistent-catalogues"     # the shipped corpus alone
    c.scan_layers, c.moe.jitter = True, 0.0
    for k, v in kw.items():
        node, _, field = k.rpartition("__")      # data__vocab_path: c.data.vocab_path
        setattr(c[node] if node else c, field, v)
    return c


def train_losses(workdir) -> list[float]:
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


def test_a_pipelined_run_trains_as_unpipelined_and_its_checkpoints_cross_meshes(tmp_path):
    flat, piped = tmp_path / "flat", tmp_path / "piped"
    # The same 4 batch shards (the input pipeline reads rows per shard) without stages.
    loop.train(run_config(mesh="data:4,model:2"), flat, print_fn=lambda *_: None)
    loop.train(run_config(layout="dp_pp", mesh="stage:2,data:4", pipeline_microbatches=2,
                          data__vocab_path=str(flat / "tokenizer.model")),
               piped, print_fn=lambda *_: None)
    np.testing.assert_allclose(train_losses(piped), train_losses(flat), rtol=1e-5)
    # Each run's checkpoint loads on the other run's kind of mesh and on one device, bitwise
    # the same parameters: only the shardings differ. (The two runs' weights are compared
    # through their losses: under the tests' fast-compile flags their initial weights can
    # differ in the last bit between a stage mesh and a flat one, and Adam's first steps
    # magnify that on near-zero gradients.)
    one = L.Layout.create("data_parallel", L.make_mesh("data:1", devices=jax.devices()[:1]))
    stages = L.Layout.create("dp_pp", L.make_mesh("stage:2,data:4"))
    flat_mesh = L.Layout.create("data_parallel", L.make_mesh("data:4,model:2"))
    cfg = weights.resolve(piped).cfg
    for run, layouts in ((piped, (one, stages)), (flat, (stages, flat_mesh))):
        a, b = (jax.device_get(weights.resolve(run).load(state_lib.setup(cfg, lay)))
                for lay in layouts)
        assert jax.tree.structure(a) == jax.tree.structure(b)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("cfg, layout, mesh, error", [
    (model("switch_tiny", 4), "dp_pp", "stage:4,data:2",
     r"the decoder has 2 scanned layer groups, not divisible by 4 stages x 1 repeats"),
    (model("switch_tiny", 8, pipeline_repeats=2, pipeline_microbatches=1), "dp_pp",
     "stage:2,data:4", r"needs at least as many micro-batches as stages \(2\)"),
    (model("switch_tiny", 8, scan_layers=False), "dp_pp", "stage:2,data:4",
     r"the layers are not scanned; set --config.scan_layers=true"),
    (model("switch_tiny", 8), "batch:data+stage,layers:stage", "stage:2,data:4",
     r"splits both 'layers' and 'batch' over 'stage'"),
])
def test_a_pipeline_the_model_cannot_run_is_refused_in_one_line(cfg, layout, mesh, error):
    with pytest.raises(ValueError, match=error):
        state_lib.setup(cfg, L.Layout.create(layout, L.make_mesh(mesh)))


def test_run_settings_a_pipeline_cannot_take_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"does not divide into 3 pipeline micro-batches"):
        loop.train(run_config(layout="dp_pp", mesh="stage:2,data:4", pipeline_microbatches=3),
                   tmp_path / "a", print_fn=lambda *_: None)
    with pytest.raises(ValueError, match=r"--config.pipeline_microbatches=4 is read only with a "
                                         r"layout with 'layers:stage'"):
        loop.train(run_config(pipeline_microbatches=4), tmp_path / "b", print_fn=lambda *_: None)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_micro_batches_that_would_change_the_routing_groups_are_refused(tmp_path):
    """stage 2 x data 4, 16 rows in 8 micro-batches: 2 rows do not split over 4 batch shards,
    the stages would run unsharded and Switch would route other groups: refused in one line,
    naming the count that keeps the unpipelined step's groups (4: 4 rows a micro-batch)."""
    c = run_config(layout="dp_pp", mesh="stage:2,data:4", pipeline_microbatches=8,
                   per_device_batch_size=2)
    assert state_lib.global_batch_size(c) == 16
    with pytest.raises(ValueError, match=r"pipeline_microbatches=8 gives micro-batches of 2 rows, "
                                         r"which do not split over the batch's 4 shards.*use "
                                         r"--config.pipeline_microbatches=4 "):
        loop.train(c, tmp_path / "run", print_fn=lambda *_: None)
    assert not (tmp_path / "run").exists()
