"""Sparse upcycling (switchzoo.upcycle): every expert is its layer's dense MLP bit for bit, the
upcycled model computes the dense model's function when every expert serves every token, the
checkpoint round-trips through the Hugging Face format, a dense run's workdir upcycles as its
weights do, bad inputs write nothing, and train.py continues from the result."""
import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx

import switchzoo
from switchzoo import api, checkpoints, hf, loop, tensorfile, transformer, upcycle, weights
from switchzoo import state as state_lib

from test_end_to_end import files, logged_steps, tiny_config  # noqa: F401  (files: a fixture)
from test_hf import inputs, t5_checkpoint

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


def test_the_upcycled_model_computes_the_dense_function_when_each_token_visits_every_expert(
        upcycled):
    """Top-E routing with gates renormalised to sum to one, room for every token: any convex
    mixture of identical experts is the dense MLP."""
    dense, out = upcycled
    origin = weights.resolve(out)
    cfg = origin.cfg.replace(moe=dataclasses.replace(origin.cfg.moe, top_k=4, dispatch="einsum"))
    src, mask, dec = inputs(512)
    got, want = (np.asarray(api.Model(s.cfg, s.graphdef, o.load(s), s.layout)(
        src, attention_mask=mask, decoder_input_ids=dec))
        for o, s in ((origin, state_lib.setup(cfg, **ONE_DEVICE)),
                     (weights.resolve(dense), state_lib.setup(weights.resolve(dense).cfg,
                                                              **ONE_DEVICE))))
    assert np.abs(got - want).max() <= 1e-5


def test_round_trip_through_the_hugging_face_format_and_the_catalogue_routing(upcycled,
                                                                              tmp_path):
    _, out = upcycled
    origin = weights.resolve(out)
    want = switchzoo.zoo.get(TARGET).replace(vocab_size=512)
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
    assert "from step 0" in lines[1] and logged_steps(tmp_path) == [2]
    moe = json.loads((tmp_path / weights.MODEL_FILE).read_text())["moe"]
    assert (moe["group_size"], moe["expert_capacity"], moe["num_experts"]) == (32, None, 4)
    assert weights.resolve(tmp_path).is_workdir     # and this run can start the next one
