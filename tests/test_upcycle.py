"""Sparse upcycling (switchzoo.upcycle): every expert is its layer's dense MLP bit for bit, the
upcycled model starts with its dense source's loss (top-1 and top-2: its gates sum to one per
token, after capacity, and its router keeps a gradient), the checkpoint keeps the catalogue's
routing and is refused in the Hugging Face format, a dense run's workdir upcycles as its weights
do, bad inputs write nothing, and train.py continues from the result."""
import dataclasses
import json

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import switchzoo
from switchzoo import checkpoints, hf, loop, steps, transformer, upcycle, weights
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


def flat_params(origin: weights.Origin) -> dict:
    """{parameter path: array} of a checkpoint's weights, loaded unrolled on one device."""
    cfg = origin.cfg.replace(scan_layers=False)
    params = jax.device_get(origin.load(state_lib.setup(cfg, **ONE_DEVICE)))
    return {tuple(getattr(k, "key", k) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_every_expert_is_its_layers_dense_mlp_and_every_other_weight_is_copied(upcycled):
    dense, out = upcycled
    up = weights.resolve(out)
    want, got = flat_params(weights.resolve(dense)), flat_params(up)
    sparse = weights.sparse_layers(up.cfg)
    E = up.cfg.moe.num_experts
    experts = 0
    for keys, leaf in got.items():
        if "router" in keys:
            continue
        source = want.pop(keys)     # KeyError: a weight the dense model does not have
        assert leaf.dtype == source.dtype, keys
        if keys[1:2] == ("layers",) and keys[2] in sparse[keys[0]] and keys[3] == "ffn":
            assert leaf.shape == (E,) + source.shape, keys
            for e in range(E):
                assert leaf[e].tobytes() == source.tobytes(), (keys, e)
            experts += 1
        else:
            assert leaf.tobytes() == source.tobytes(), keys
    assert experts == 2 * 2           # (wi, wo) x one Switch layer per stack
    assert not want                   # nothing of the dense model left behind


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


def test_the_checkpoint_keeps_the_catalogue_routing_and_refuses_the_hugging_face_format(
        upcycled, tmp_path):
    """model.json holds what the HF config cannot (the catalogue's capacity factors,
    gates_sum_to_one); saving the model in HF format is refused in one line, writing nothing:
    transformers would scale each expert by the raw router probability (hf.refusal)."""
    _, out = upcycled
    origin = weights.resolve(out)
    want = switchzoo.zoo.get(TARGET).replace(vocab_size=512)
    want = want.replace(moe=dataclasses.replace(want.moe, gates_sum_to_one=True))
    assert origin.cfg == want       # model.json: the catalogue's capacity factors, not HF's 64
    assert weights.read_model(out / weights.MODEL_FILE) == want
    params = origin.load(state_lib.setup(origin.cfg, **ONE_DEVICE))
    with pytest.raises(hf.CheckpointError) as e:
        hf.save(tmp_path / "hf", origin.cfg, params)
    assert str(e.value).startswith("cannot save in Hugging Face format: moe.gates_sum_to_one")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "hf").exists()


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
    assert ((tmp_path / "up" / weights.MODEL_FILE).read_bytes()
            == (out / weights.MODEL_FILE).read_bytes())
    want, got = flat_params(weights.resolve(out)), flat_params(weights.resolve(tmp_path / "up"))
    assert sorted(got) == sorted(want)
    for keys, leaf in got.items():
        assert leaf.dtype == want[keys].dtype and leaf.tobytes() == want[keys].tobytes(), keys
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


def dense_run(root, optimizer: str, steps_done: int = 4):
    """A dense LM's optimizer run ``steps_done`` steps (random gradients: the optimizer is what
    is continued; a model's backward pass would only add compile time) under T5's rsqrt
    schedule (lr 0.01, k 2: decaying from step 2), saved as the loop saves: (workdir, final
    state, optimizer)."""
    cfg = switchzoo.zoo.get("dense_tiny")
    tx = state_lib.make_optimizer(optimizer, 1e-2, 2, 0.0, "rsqrt")
    s = state_lib.setup(cfg, optimizer=tx, **ONE_DEVICE)
    state = s.init()

    @jax.jit
    def step(state, grads):
        updates, opt_state = s.tx.update(grads, state.opt_state, state.params)
        return state_lib.TrainState(state.step + 1, optax.apply_updates(state.params, updates),
                                    opt_state)
    for i in range(steps_done):
        state = step(state, random_grads(state.params, seed=100 + i))
    ckpt = checkpoints.Checkpoints(root / "checkpoints", 1)
    ckpt.save(steps_done, state, {}, force=True)
    ckpt.close()
    weights.write_model(root, cfg)
    return root, jax.device_get(state), tx


def continued(out, tx):
    """The continued run's state as train.py's init_from builds it, and its set-up."""
    origin = weights.resolve(out)
    s = state_lib.setup(origin.cfg, optimizer=tx, **ONE_DEVICE)
    state, line = upcycle.continued_state(origin, s, s.state_from(origin.load(s)))
    return s, jax.device_get(state), line, origin


def random_grads(params, seed=7):
    key = jax.random.key(seed)
    return jax.tree.map(lambda p: np.asarray(jax.random.normal(jax.random.fold_in(
        key, p.size), p.shape), np.float32), params)


def test_continue_schedule_goes_on_at_the_dense_step_with_fresh_moments(tmp_path):
    """--continue schedule: the first continued step's update is a hand-written Adam's at the
    dense run's schedule for step S + 1 (lr 0.01 x sqrt(2 / 4)) from zero moments, bias
    corrected for step S + 1; a fresh start would use lr 0.01 and step 1's corrections."""
    dense, _, tx = dense_run(tmp_path / "lm", "adamw")
    assert upcycle.main(["--dense", str(dense), "--model", "switch_tiny", "--out",
                         str(tmp_path / "up"), "--continue", "schedule"]) == 0
    s, state, line, origin = continued(tmp_path / "up", tx)
    assert int(state.step) == 4 and "from step 4" in line
    grads = random_grads(state.params)
    updates = jax.device_get(jax.jit(s.tx.update)(grads, state.opt_state, state.params)[0])
    lr, t = 1e-2 * np.sqrt(2 / 4), 5
    for (path, u), g in zip(jax.tree_util.tree_leaves_with_path(updates),
                            jax.tree.leaves(grads)):
        m_hat = 0.1 * g / (1 - 0.9 ** t)
        v_hat = 0.02 * g * g / (1 - 0.98 ** t)
        np.testing.assert_allclose(u, -lr * m_hat / (np.sqrt(v_hat) + 1e-8), rtol=2e-4,
                                   atol=1e-9, err_msg=state_lib.path_name(path))
    # moe.straight_through_steps counts from where the run began: steps 5..7 here
    st = origin.cfg.replace(moe=dataclasses.replace(origin.cfg.moe, straight_through_steps=3))
    last, plain = upcycle.straight_through_phase(dataclasses.replace(s, cfg=st), origin, 100)
    assert last == 7 and plain.cfg.moe.straight_through_steps == 0


def test_continue_optimizer_copies_the_dense_moments_into_every_expert(tmp_path):
    """--continue optimizer (Adafactor, the recipe's): every expert's statistics are its dense
    MLP's, every other weight's its own, the routers' fresh (zero); and the first continued
    update of any weight, expert slices included, is the dense run's own optimizer going on
    one step (its step S + 1) with that gradient."""
    dense, dense_state, tx = dense_run(tmp_path / "lm", "adafactor")
    assert upcycle.main(["--dense", str(dense), "--model", "switch_tiny", "--out",
                         str(tmp_path / "up"), "--continue", "optimizer"]) == 0
    s, state, line, origin = continued(tmp_path / "up", tx)
    assert int(state.step) == 4 and "optimizer state" in line
    names = set(s.dims)
    got, want = (upcycle._by_statistic(x, names) for x in (state.opt_state,
                                                              dense_state.opt_state))
    assert set(got) == {"v_row", "v_col", "v"}
    experts = 0
    for stat, flat in got.items():
        for name, x in flat.items():
            if "/router/" in name:
                assert not np.any(x), name
            elif s.dims[name][0] == "experts":
                experts += 1
                for e in range(x.shape[0]):
                    np.testing.assert_array_equal(x[e], want[stat][name], err_msg=name)
            else:
                np.testing.assert_array_equal(x, want[stat][name], err_msg=name)
    assert experts == 3 * 2 * 2          # 3 statistics x (wi, wo) x 2 Switch layers
    # with expert_momentum the experts' average starts at zero, the rest continues as above
    sm = state_lib.setup(origin.cfg, optimizer=tx, expert_momentum=0.9, **ONE_DEVICE)
    averaged, _ = upcycle.continued_state(origin, sm, sm.state_from(origin.load(sm)))
    got_m = upcycle._by_statistic(jax.device_get(averaged.opt_state), names)
    assert set(got_m) == {"v_row", "v_col", "v", "ema"} and len(got_m["ema"]) == 2 * 2
    assert not any(np.any(x) for x in got_m["ema"].values())
    for stat in ("v_row", "v_col", "v"):
        for name, x in got[stat].items():
            np.testing.assert_array_equal(got_m[stat][name], x, err_msg=name)
    grads = random_grads(state.params)
    updates = jax.device_get(jax.jit(s.tx.update)(grads, state.opt_state, state.params)[0])
    flat_g, flat_u = upcycle._flat(grads), upcycle._flat(updates)
    dense_update = jax.jit(lambda g: tx.update(g, dense_state.opt_state, dense_state.params)[0])
    for e in (0, 5):                   # the dense optimizer on expert e's gradient slice
        g = upcycle._nest({n: flat_g[n][e] if s.dims[n][0] == "experts" else flat_g[n]
                           for n in upcycle._flat(dense_state.params)})
        for name, u in upcycle._flat(jax.device_get(dense_update(g))).items():
            mine = flat_u[name][e] if s.dims[name][0] == "experts" else flat_u[name]
            np.testing.assert_allclose(mine, u, rtol=1e-5, atol=1e-9, err_msg=name)


def test_bad_continue_and_straight_through_settings_are_refused_in_one_line(upcycled, tmp_path,
                                                                             capsys):
    dense, _ = upcycled
    cases = [(["--continue", "schedule"], "--continue schedule needs a switchzoo workdir"),
             (["--straight-through-steps", "-2"], "moe.straight_through_steps=-2: use 0")]
    for extra, message in cases:
        assert upcycle.main(["--dense", str(dense), "--model", TARGET, "--out",
                             str(tmp_path / "o"), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="only with moe.gates_sum_to_one=true"):
        switchzoo.config.MoeConfig(straight_through_steps=5)
