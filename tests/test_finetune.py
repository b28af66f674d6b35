"""Fine-tuning end to end: a Hugging Face checkpoint fine-tuned on a task of your own files,
scored by the task's metric every few steps with the best checkpoint kept, scored again on
another split by eval.py, loaded from its workdir, exported back to Hugging Face format, where
transformers computes the same logits; and predictions that do not depend on the batch."""
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

import switchzoo
from conftest import FAST_COMPILE, Lazy
from switchzoo import api, evaluate, finetune, loop, predict, tasks
from switchzoo import state as state_lib
from switchzoo import zoo
from switchzoo.config import ModelConfig, MoeConfig
from switchzoo.configs import finetune as finetune_config
from switchzoo.data import tokenizer as tokenizer_lib

torch, transformers = Lazy("torch"), Lazy("transformers")
ONE_DEVICE = dict(layout="data_parallel", mesh="data:1", devices=jax.devices()[:1])


def routed_model(eval_groups: str) -> api.Model:
    """switch_demo's shape (groups of 256 tokens) at evaluation capacity factor 1.0, random
    weights (std 0.3: routers far from uniform, so experts overflow)."""
    cfg = zoo.get("switch_demo")
    cfg = cfg.replace(vocab_size=512, moe=dataclasses.replace(
        cfg.moe, eval_capacity_factor=1.0, eval_groups=eval_groups))
    s = state_lib.setup(cfg, **ONE_DEVICE)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: (0.3 * rng.standard_normal(a.shape)).astype(np.float32),
                          s.abstract_params)
    return api.Model(s.cfg, s.graphdef, params, s.layout)


def test_predictions_do_not_depend_on_the_batch():
    rng = np.random.default_rng(1)
    src = rng.integers(2, 512, (16, 32))
    mask = np.ones_like(src)
    mask[0, 20:] = 0
    src = src * mask
    dec = np.concatenate([np.zeros((16, 1), int), rng.integers(2, 512, (16, 7))], axis=1)
    alone_vs_batch = {}
    for groups in ("train", "sequence"):
        model = routed_model(groups)
        one = np.asarray(model(src[:1], attention_mask=mask[:1], decoder_input_ids=dec[:1]))
        many = np.asarray(model(src, attention_mask=mask, decoder_input_ids=dec))[:1]
        alone_vs_batch[groups] = np.abs(one - many).max()
        if groups == "sequence":
            np.testing.assert_allclose(one, many, atol=1e-5)
            np.testing.assert_array_equal(
                model.generate(src[:1], attention_mask=mask[:1], max_new_tokens=6),
                model.generate(src, attention_mask=mask, max_new_tokens=6)[:1])
    # the test can fail: routed in training's groups, the neighbours change the example
    assert alone_vs_batch["train"] > 1e-3, alone_vs_batch


TEXTS = {"positive": ["a fine and moving film", "warm witty and wise", "a real joy to watch",
                      "great acting and a great story"],
         "negative": ["a dull and tired mess", "flat lifeless and long", "a waste of two hours",
                      "bad acting and a bad story"]}


def write_task(directory):
    rows = [{"text": t, "label": int(lab == "positive")} for lab, ts in TEXTS.items()
            for t in ts]
    for split in ("train", "dev", "test"):
        (directory / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random Switch checkpoint in Hugging Face format with its SentencePiece model: room for
    every token of a sequence (expert_capacity 64, a group per sequence), as transformers
    routes."""
    path = tmp_path_factory.mktemp("hf")
    texts = [t for ts in TEXTS.values() for t in ts] * 20 + ["sentiment: positive negative"] * 20
    proto = tokenizer_lib.train(texts, 48)
    cfg = ModelConfig(vocab_size=256, d_model=32, num_heads=4, d_kv=8, d_ff=48, num_layers=2,
                      num_encoder_layers=2, moe=MoeConfig(num_experts=4, group_size=0,
                                                          expert_capacity=64, sparse_every=2,
                                                          sparse_offset=1))
    s = state_lib.setup(cfg, seed=3, **ONE_DEVICE)
    model = api.Model(s.cfg, s.graphdef, s.init(), s.layout, tokenizer={"spiece.model": proto})
    model.save_pretrained(path)
    return path


def finetune_task(config):
    return tasks.resolve(config.finetune)[0]


def test_fine_tune_from_hugging_face_and_back(hf_dir, tmp_path):
    write_task(tmp_path)
    c = finetune_config.get_config("task=files,model=switch_base_tiny,steps=4")
    c.init_from, c.eval_every_steps, c.checkpoint_every_steps = str(hf_dir), 2, 2
    c.layout, c.per_device_batch_size, c.max_length = "data_parallel", 1, 16   # 8 devices
    c.finetune.target_length, c.learning_rate = 8, 1e-2
    c.finetune.update(train_files=str(tmp_path / "train.jsonl"),
                      eval_files=str(tmp_path / "dev.jsonl"), inputs="review: {text}",
                      targets="{label}", labels="negative,positive", metrics="accuracy,f1")
    workdir = tmp_path / "run"
    loop.train(c, workdir)
    evals = [json.loads(line) for line in (workdir / "metrics.jsonl").open()
             if '"eval"' in line]
    assert [r["step"] for r in evals] == [2, 4]
    scores = evals[0]["tasks"]["files"]
    assert scores["examples"] == 8 and {"accuracy", "f1", "invalid_outputs"} <= scores.keys()
    best = finetune.best_record(workdir)
    assert best["step"] in (2, 4) and evals[[2, 4].index(best["step"])]["best"]
    assert json.loads((workdir / "config.json").read_text())["data"]["vocab_path"].endswith(
        "spiece.model")                       # the checkpoint's own vocabulary

    # eval.py scores another split (its own results file) at the best checkpoint
    config = evaluate.load_config(workdir, {"finetune.eval_files": str(tmp_path / "test.jsonl")})
    results = evaluate.run(config, workdir, print_fn=lambda *a: None)
    assert results["step"] == best["step"] and results["tasks"]["files"]["examples"] == 8
    (predictions,) = workdir.glob("predictions-*.jsonl")
    first = json.loads(predictions.read_text().splitlines()[0])
    assert first["inputs"] == "review: a fine and moving film" and first["reference"] == "positive"

    # your own inputs: a plain line fills the task's one column, a JSON line names it
    inputs = tmp_path / "mine.txt"
    inputs.write_text('a fine and moving film\n{"text": "a dull and tired mess"}\n')
    printed = []
    outs = predict.run(config, workdir, str(inputs), print_fn=printed.append)
    assert len(outs) == 2 and printed == outs
    assert predict.task_inputs(finetune_task(config), ["great"], "x", config) == ["review: great"]

    # the workdir loads (its best checkpoint) and goes back to Hugging Face format exactly
    ours = switchzoo.from_pretrained(workdir)
    ours.save_pretrained(tmp_path / "export")
    assert (tmp_path / "export" / "spiece.model").read_bytes() == (hf_dir / "spiece.model"
                                                                     ).read_bytes()
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "export").eval()
    rng = np.random.default_rng(0)
    src, dec = rng.integers(2, 256, (2, 9)), rng.integers(2, 256, (2, 5))
    dec[:, 0] = 0
    mask = np.ones_like(src)
    with torch.no_grad():
        want = theirs(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                      decoder_input_ids=torch.tensor(dec)).logits.numpy()
    got = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=dec))
    np.testing.assert_allclose(got, want, atol=1e-4)
    # and the weights are the fine-tuned ones, not the checkpoint's
    start = switchzoo.from_pretrained(hf_dir)
    assert np.abs(np.asarray(start(src, attention_mask=mask, decoder_input_ids=dec))
                  - got).max() > 1e-4


def test_a_decoder_only_model_is_refused_for_a_text_to_text_task():
    c = finetune_config.get_config("task=movie_reviews,model=switch_tiny")
    with pytest.raises(ValueError, match="task 'text2text' needs an encoder-decoder model"):
        state_lib.run_model_config(c, 300)


def test_a_data_source_is_not_read_by_a_fine_tune():
    from switchzoo import validate
    c = finetune_config.get_config("task=movie_reviews")
    c.data.source = "files"
    with pytest.raises(ValueError, match="data.source='files' is read only with task="):
        validate.check(c)


def test_glue_sst2_from_a_prepared_tfds_directory_under_dp_ep(tmp_path):
    """A few real steps of a Switch model at a reduced size on glue/sst2 (read from a prepared
    tfds directory, no builder code) with the experts over the expert axis: 8 devices, the
    task scored, the best checkpoint kept."""
    from test_tasks import Glue
    Glue(data_dir=str(tmp_path / "tfds"), config="sst2",
         file_format="array_record").download_and_prepare()
    c = finetune_config.get_config("task=glue_sst2,model=switch_base_tiny,steps=2,layout=dp_ep")
    c.mesh, c.per_device_batch_size, c.max_length = "data:2,model:1,expert:4", 1, 16
    c.eval_every_steps, c.checkpoint_every_steps, c.finetune.target_length = 2, 2, 8
    vocab = tmp_path / "spiece.model"
    vocab.write_bytes(tokenizer_lib.train([t for ts in TEXTS.values() for t in ts] * 20
                                          + ["sst2 sentence: a gem a mess"] * 20, 48))
    c.data.tfds_data_dir, c.data.vocab_path = str(tmp_path / "tfds"), str(vocab)
    loop.train(c, tmp_path / "run", print_fn=lambda *a: None)
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()
              if '"eval"' in line]
    assert row["tasks"]["glue_sst2"]["examples"] == 1 and row["best"]
    assert finetune.best_record(tmp_path / "run")["step"] == 2


def test_the_finetune_config_opens_with_its_command():
    assert finetune_config.__doc__.startswith("python train.py --config=configs/finetune.py")
    c = finetune_config.get_config("task=glue_sst2,steps=7")
    assert (c.task, c.finetune.task, c.num_train_steps, c.schedule) == (
        "text2text", "glue_sst2", 7, "constant")


def test_a_t5x_checkpoint_written_by_t5x_starts_a_fine_tune(tmp_path):
    """init_from the T5X fixture (a tiny T5 v1.1 that T5X wrote, arrays inline): its weights
    start the run, its hyper-parameters read from the shapes."""
    from test_t5x import TINY
    write_task(tmp_path)
    vocab = tmp_path / "spiece.model"
    vocab.write_bytes(tokenizer_lib.train([t for ts in TEXTS.values() for t in ts] * 20
                                          + ["review: positive negative"] * 20, 48))
    c = finetune_config.get_config("task=files,model=t5_tiny,steps=2")
    c.init_from = str(TINY / "checkpoint_0")
    c.eval_every_steps = c.checkpoint_every_steps = 2
    c.per_device_batch_size, c.max_length, c.finetune.target_length = 1, 16, 8
    c.data.vocab_path = str(vocab)
    c.finetune.update(train_files=str(tmp_path / "train.jsonl"),
                      eval_files=str(tmp_path / "dev.jsonl"), inputs="review: {text}",
                      targets="{label}", labels="negative,positive", metrics="accuracy")
    lines = []
    loop.train(c, tmp_path / "run", print_fn=lines.append)
    loaded = next(line for line in lines if line.startswith("init_from"))
    assert "the T5X checkpoint" in loaded and "checkpoint_0" in loaded and json.loads(
        (tmp_path / "run" / "model.json").read_text())["d_model"] == 8
    assert finetune.best_record(tmp_path / "run")["step"] == 2


def test_train_py_refuses_an_unknown_task_in_one_line(tmp_path):
    root = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "train.py", "--config=configs/finetune.py:task=sst3",
                          f"--workdir={tmp_path / 'run'}"], capture_output=True, text=True,
                         cwd=root, timeout=120, env={**os.environ, "XLA_FLAGS": FAST_COMPILE})
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "unknown task 'sst3'; known: cnn_dailymail, glue_cola" in out.stderr
    assert not (tmp_path / "run").exists()


def test_expert_dropout_is_set_once_and_never_on_a_dense_model():
    c = finetune_config.get_config("task=movie_reviews,model=switch_base_tiny")
    assert state_lib.run_model_config(c, 300).moe.expert_dropout == 0.4      # the recipe's
    c.finetune.expert_dropout, c.moe.expert_dropout = 0.1, 0.2
    with pytest.raises(ValueError, match="both set; set one"):
        state_lib.run_model_config(c, 300)
    dense = finetune_config.get_config("task=movie_reviews,model=t5_tiny")
    dense.finetune.expert_dropout = 0.1
    with pytest.raises(ValueError, match="set for a dense model, which has no experts"):
        state_lib.run_model_config(dense, 300)
