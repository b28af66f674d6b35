"""Sparse upcycling (switchzoo.upcycle): every expert is its layer's dense MLP bit for bit, the
upcycled model starts with its dense source's loss (top-1 and top-2: its gates sum to one per
token, after capacity, and its router keeps a gradient), the checkpoint round-trips through the
Hugging Face format, a dense run's workdir upcycles as its weights do, bad inputs write
nothing, and train.py continues from the result."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import switchzoo
from switchzoo import (checkpoints, hf, loop, routing, steps, tensorfile, transformer, upcycle,
                       weights)
from switchzoo import state as state_lib

from test_end_to_end import files, logged_steps, tiny_config  # noqa: F401  (files: a fixture)
from test_hf import t5_checkpoint

TARGET = "switch_base_tiny"       # d_model 64, d_ff 128, 4 heads x 16, 2+2 layers, ReLU, tied
ONE_DEVICE = dict(layout="data_parallel", mesh="data:1", devices=jax.devices()[:1])  # compiles fast


def t5(path, **changes):
    """A random Hugging Face T5 v1.0 (ReLU, tied) shaped like TARGET; 512 ids hold the test
    tokenizer's 400."""
    t5_checkpoint(path, **{**dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128,
                                  num_decoder_layers=2, feed_forward_proj="relu"), **changes})
    return path


@pytest.fixture(scope="module")
def upcycled(tmp_path_factory):
    root = tmp_path_factory.mktemp("upcycle")
    dense = t5(root / "t5")
    assert upcycle.main(["--dense", str(dense), "--model", TARGET, "--out",
                         str(root / "out"), "--seed", "3"]) == 0
    return dense, root / "out"


def test_every_expert_is_its_layers_dense_mlp_and_every_other_weight_is_copied(upcycled):
    dense, out = upcycled
    a = tensorfile.TensorFile(dense / hf.SINGLE)
    b = tensorfile.TensorFile(out / hf.SINGLE)
    used, experts = set(), 0
    for name in b.names():
        if ".router." in name:
            continue
        # switch: encoder.block.1.layer.1.mlp.experts.expert_3.wi.weight
        # t5:     encoder.block.1.layer.1.DenseReluDense.wi.weight
        parts = name.split(".")
        if "experts" in parts:
            experts += 1
            del parts[parts.index("experts"):parts.index("experts") + 2]
        source = ".".join(parts).replace(".mlp.", ".DenseReluDense.")
        assert a.get(source).dtype == b.get(name).dtype
        assert a.get(source).tobytes() == b.get(name).tobytes(), name
        used.add(source)
    assert experts == 2 * 4 * 2       # (wi, wo) x 4 experts x one Switch layer per stack
    assert used == set(a.names())     # nothing of the dense model left behind


def test_routers_are_the_models_own_initialisation_with_the_seed(upcycled):
    _, out = upcycled
    origin = weights.resolve(out)
    got = origin.load(state_lib.setup(origin.cfg, **ONE_DEVICE))

    def routers():     # transformer.build(cfg, 3)'s, jitted as Setup.init (a fresh run) does
        params = nnx.to_pure_dict(nnx.state(transformer.build(origin.cfg, 3)))
        return [params[s]["layers"][1]["ffn"]["router"]["w"] for s in ("encoder", "decoder")]
    want = jax.jit(routers)()
    for stack, w in zip(("encoder", "decoder"), want):
        np.testing.assert_array_equal(got[stack]["layers"][1]["ffn"]["router"]["w"], w)


def held_out_batch(vocab=512):
    """Four translation pairs of random ids, drawn apart from every other batch here: 128
    source tokens (4 routing groups of TARGET's 32) and 64 target tokens (2 groups)."""
    rng = np.random.default_rng(11)
    targets = rng.integers(2, vocab, (4, 16)).astype(np.int32)
    return {"inputs": rng.integers(2, vocab, (4, 32)).astype(np.int32), "targets": targets,
            "weights": np.ones_like(targets, np.float32)}


def eval_loss(origin, cfg, batch) -> float:
    """Mean target-token cross-entropy of the evaluation step (no jitter, no dropout)."""
    s = state_lib.setup(cfg, **ONE_DEVICE)
    out = steps.make_eval_step(s)(origin.load(s), batch)
    return float(out["nll"] / out["tokens"])


def test_the_upcycled_model_starts_as_its_dense_source_with_top_1_and_top_2_routing(upcycled):
    """Step 0's evaluation loss on a held-out batch is the dense model's, for the catalogue's
    top-1 and for top-2 (--config.moe.top_k=2 over the same checkpoint), with every pick served:
    dropless dispatch, or einsum at an evaluation capacity factor of E (C = N). Without
    gates_sum_to_one, top-1 scales each Switch layer by its router probability (~1/E): here
    +0.06 nats. At the catalogue's factor (2.0) capacity drops tokens, which lose their Switch
    layers' output (a top-2 token only once it loses both picks): -0.002 to -0.003 here."""
    dense, out = upcycled
    batch = held_out_batch()
    source = weights.resolve(dense)
    want = eval_loss(source, source.cfg, batch)
    up = weights.resolve(out)
    assert up.cfg.moe.gates_sum_to_one and up.cfg.moe.top_k == 1

    def loss(**moe):
        return eval_loss(up, up.cfg.replace(moe=dataclasses.replace(up.cfg.moe, **moe)), batch)
    for top_k in (1, 2):
        assert abs(loss(top_k=top_k, dispatch="dropless") - want) <= 1e-3, top_k
    E = up.cfg.moe.num_experts
    assert abs(loss(dispatch="einsum", eval_capacity_factor=E) - want) <= 1e-3


ROUTE = jax.jit(routing.route, static_argnums=(1, 2), static_argnames="sum_to_one")


def test_a_token_that_loses_a_pick_to_capacity_keeps_gates_summing_to_one():
    """Komatsuzaki et al. 2022 app. B.7 renormalise *after* routing: with capacity 1, token 1's
    first choice (expert 0) is taken by token 0's, and its second (expert 2) gets all its
    weight; normalize_top_k's gates, set before capacity, would leave it p_2 / (p_0 + p_2)."""
    logits_GNE = jnp.log(jnp.array([[[0.6, 0.3, 0.1], [0.5, 0.1, 0.4]]]))
    for sum_to_one, token_1 in ((True, 1.0), (False, 0.4 / 0.9)):
        r = ROUTE(logits_GNE, 2, 1, sum_to_one=sum_to_one)
        assert r.metrics["dropped_fraction"] == 0.25
        np.testing.assert_allclose(np.sum(r.combine_GNEC, axis=(2, 3)), [[1.0, token_1]],
                                   rtol=1e-6)
        np.testing.assert_allclose(np.sum(r.combine_GNEC[0, 1], -1), [0, 0, token_1], rtol=1e-6)


def test_top_1_gates_are_one_and_the_router_keeps_the_raw_probabilitys_gradient():
    """The exact renormalised top-1 gate is the constant 1, which would leave the router only
    the aux and z losses; straight-through, it learns from the loss as an unnormalised Switch
    router does (the kept gate's gradient is the probability's)."""
    logits_GNE = jax.random.normal(jax.random.key(0), (2, 8, 4))
    w_GNEC = jax.random.normal(jax.random.key(1), (2, 8, 4, 2))

    def objective(logits, sum_to_one):
        return jnp.sum(routing.route(logits, 1, 2, sum_to_one=sum_to_one).combine_GNEC * w_GNEC)
    grad = jax.jit(jax.grad(objective), static_argnums=1)     # compiled: faster than eager ops
    r = ROUTE(logits_GNE, 1, 2, sum_to_one=True)
    kept_GN = np.sum(r.dispatch_GNEC, axis=(2, 3))
    assert 0 < kept_GN.sum() < 16                                  # some tokens dropped
    np.testing.assert_array_equal(np.sum(r.combine_GNEC, axis=(2, 3)), kept_GN)
    want = grad(logits_GNE, False)
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(grad(logits_GNE, True), want, rtol=1e-6, atol=1e-7)


def test_round_trip_through_the_hugging_face_format_and_the_catalogue_routing(upcycled,
                                                                              tmp_path):
    _, out = upcycled
    origin = weights.resolve(out)
    want = switchzoo.zoo.get(TARGET).replace(vocab_size=512)
    want = want.replace(moe=dataclasses.replace(want.moe, gates_sum_to_one=True))
    assert origin.cfg == want       # model.json: the catalogue's capacity factors, not HF's 64
    assert weights.read_model(out / weights.MODEL_FILE) == want
    assert hf.read_config(out).cfg.moe.expert_capacity == 64
    hf.save(tmp_path, origin.cfg, origin.load(state_lib.setup(origin.cfg, **ONE_DEVICE)))
    a, b = tensorfile.TensorFile(out / hf.SINGLE), tensorfile.TensorFile(tmp_path / hf.SINGLE)
    assert sorted(a.names()) == sorted(b.names())
    for n in a.names():
        assert a.get(n).tobytes() == b.get(n).tobytes(), n
    assert (tmp_path / "config.json").read_text() == (out / "config.json").read_text()


@pytest.mark.parametrize("changes, message", [
    (dict(d_ff=256), f"error: {TARGET} has d_ff 128 but the dense checkpoint has 256"),
    (dict(d_model=32, d_kv=8), f"error: {TARGET} has d_model 64 but the dense checkpoint has 32"),
    (dict(feed_forward_proj="gated-gelu"),
     f"error: {TARGET} has activation relu but the dense checkpoint has gated-gelu"),
])
def test_a_dense_model_of_other_shape_is_refused_in_one_line_writing_nothing(
        tmp_path, capsys, changes, message):
    dense = t5(tmp_path / "t5", **changes)
    capsys.readouterr()
    code = upcycle.main(["--dense", str(dense), "--model", TARGET, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t5"]


def test_bad_targets_and_an_existing_out_are_refused(upcycled, tmp_path, capsys):
    dense, out = upcycled
    cases = [(["--dense", str(dense), "--model", TARGET, "--out", str(out)],
              "exists and is not an empty directory"),
             (["--dense", str(dense), "--model", "t5_tiny", "--out", str(tmp_path / "o")],
              "t5_tiny is a dense model"),
             (["--dense", str(out), "--model", TARGET, "--out", str(tmp_path / "o")],
              "already has Switch layers")]
    for argv, message in cases:
        assert upcycle.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())
    with pytest.raises(SystemExit) as e:
        upcycle.main(["--dense", str(dense)])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: bad flag: the following arguments are "
                                              "required: --model, --out")


def test_a_dense_workdir_upcycles_to_the_same_checkpoint_with_its_tokenizer(upcycled, tmp_path):
    """A run's workdir (its newest checkpoint, as the training loop saves one: parameters,
    optimizer state and input state; here of a run with scanned layers) gives what its weights
    give from a Hugging Face directory, bit for bit, plus the run's tokenizer."""
    dense, out = upcycled
    origin = weights.resolve(dense)
    scanned = origin.cfg.replace(scan_layers=True)
    setup = state_lib.setup(scanned, optimizer="adamw", **ONE_DEVICE)
    ckpt = checkpoints.Checkpoints(tmp_path / "run" / "checkpoints", 1)
    ckpt.save(7, setup.state_from(origin.load(setup)), {}, force=True)
    ckpt.close()
    weights.write_model(tmp_path / "run", scanned)
    (tmp_path / "run" / "tokenizer.model").write_bytes(b"the run's SentencePiece model")
    assert upcycle.main(["--dense", str(tmp_path / "run"), "--model", TARGET, "--out",
                         str(tmp_path / "up"), "--seed", "3"]) == 0
    for name in (hf.SINGLE, "config.json", weights.MODEL_FILE):
        assert (tmp_path / "up" / name).read_bytes() == (out / name).read_bytes(), name
    assert (tmp_path / "up" / "tokenizer.model").read_bytes() == b"the run's SentencePiece model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "up"]     # no temporary left


def test_train_continues_from_the_upcycled_checkpoint_with_the_catalogue_routing(
        upcycled, files, tmp_path):   # noqa: F811
    _, out = upcycled
    lines = []
    run = tiny_config(files, 2)
    run.init_from = str(out)
    loop.train(run, tmp_path, print_fn=lines.append)
    assert any("from step 0" in line for line in lines) and logged_steps(tmp_path) == [2]
    moe = json.loads((tmp_path / weights.MODEL_FILE).read_text())["moe"]
    assert (moe["group_size"], moe["expert_capacity"], moe["num_experts"]) == (32, None, 4)
    assert moe["gates_sum_to_one"] is True      # model.json's, which the HF config cannot hold
    assert weights.resolve(tmp_path).is_workdir     # and this run can start the next one


def test_a_decoder_only_model_upcycles_to_a_switchzoo_checkpoint(tmp_path):
    """The Hugging Face format holds no decoder-only model: the upcycled LM is written as a
    switchzoo checkpoint of the weights (checkpoints/0 + model.json) that init_from reads; its
    experts are the dense MLPs, routers fresh, everything else copied."""
    dense_cfg = switchzoo.zoo.get("dense_tiny")
    setup = state_lib.setup(dense_cfg, optimizer="adamw", **ONE_DEVICE)
    state = setup.init()
    ckpt = checkpoints.Checkpoints(tmp_path / "lm" / "checkpoints", 1)
    ckpt.save(5, state, {}, force=True)
    ckpt.close()
    weights.write_model(tmp_path / "lm", dense_cfg)
    assert upcycle.main(["--dense", str(tmp_path / "lm"), "--model", "switch_tiny", "--out",
                         str(tmp_path / "up")]) == 0
    origin = weights.resolve(tmp_path / "up")
    assert origin.is_workdir and origin.cfg.moe.gates_sum_to_one
    assert not (tmp_path / "up" / hf.SINGLE).exists()
    got = jax.device_get(origin.load(state_lib.setup(origin.cfg, **ONE_DEVICE)))
    assert origin.loaded["step"] == 0
    dense = jax.device_get(state.params)
    sparse = weights.sparse_layers(origin.cfg)["decoder"]
    assert len(sparse) == 2
    flat = dict(jax.tree_util.tree_flatten_with_path(got)[0])
    want = dict(jax.tree_util.tree_flatten_with_path(dense)[0])
    experts = 0
    for path, leaf in flat.items():
        keys = [getattr(k, "key", k) for k in path]
        if "router" in keys:
            continue
        source = want[path]
        if keys[:2] == ["decoder", "layers"] and keys[2] in sparse and keys[3] == "ffn":
            assert leaf.shape == (8,) + source.shape
            for e in range(8):
                np.testing.assert_array_equal(leaf[e], source)
            experts += 1
        else:
            np.testing.assert_array_equal(leaf, source, err_msg=str(keys))
    assert experts == 2 * 2 and len(flat) == len(want) + len(sparse)      # + one router each
