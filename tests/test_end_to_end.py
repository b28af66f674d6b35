"""End to end, as a user runs it: train a tiny Switch translation model a few steps with
checkpoints, run the same command again to resume, evaluate (BLEU and perplexity), restore under
another layout, fine-tune from a Hugging Face directory — on local TSV files (the tfds path:
tests/test_tfds_datasets.py)."""
import dataclasses
import json
import pathlib
import shutil

import pytest

import switchzoo
from switchzoo.configs import demo
from switchzoo import data, evaluate, hosts, loop
from switchzoo.data import embedded


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Real text: 400 English->German pairs of the shipped gettext corpus, as TSV files."""
    pairs = embedded.shipped("de")[:440]
    root = tmp_path_factory.mktemp("corpus")
    for name, rows in (("train.tsv", pairs[:400]), ("eval.tsv", pairs[400:])):
        (root / name).write_text("".join(f"{s}\t{t}\n" for s, t in rows))
    return root / "train.tsv", root / "eval.tsv"


def tiny_config(files, steps):
    c = demo.get_config(f"model=switch_base_tiny,steps={steps}")
    c.layout, c.mesh = "dp_ep", "data:2,model:1,expert:4"
    c.per_device_batch_size, c.max_length = 1, 32
    c.log_every_steps = c.checkpoint_every_steps = c.eval_every_steps = 3
    c.warmup_steps = 2
    c.data.source = "files"
    c.data.train_files, c.data.eval_files = map(str, files)
    c.data.vocab_size = 300
    c.data.max_eval_examples = 16           # of eval.tsv's 40: the held-out loss, quicker
    c.eval.max_examples, c.eval.num_beams, c.eval.max_decode_length = 8, 2, 8
    return c


@pytest.fixture(scope="module")
def trained(files, tmp_path_factory):
    """tiny_config's run trained 6 steps (checkpoints 3 and 6): the first test below resumes
    a copy of it, the last one is refused on another copy."""
    workdir = tmp_path_factory.mktemp("trained") / "run"
    loop.train(tiny_config(files, 6), workdir, print_fn=lambda *_: None)
    return workdir


def logged_steps(workdir):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if r["split"] == "train"]


def test_train_resume_evaluate_and_restore_under_another_layout(files, trained, tmp_path):
    assert logged_steps(trained) == [3, 6]
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    lines = []
    # resumed on another mesh (batch over data:2 x expert:2 = 4 batch shards, not 8): the
    # run's 8 input shards go on, and step 9 reads the batch the first mesh would have read
    moved = tiny_config(files, 9)
    moved.layout, moved.mesh = "dp_mp_ep", "data:2,model:2,expert:2"
    loop.train(moved, tmp_path, print_fn=lines.append)
    assert "resuming at step 6" in lines[-4] and lines[-3].startswith("attention: reference")
    assert lines[-2].startswith("input: process 0/1 reads rows 0..7 of each global batch")
    assert lines[-2].endswith("batch shards 0..3 of 4; input shards 0..7 of 8)")
    assert "the run's input is 8 input shards; this mesh's 4 batch shards" in lines[-1]
    assert logged_steps(tmp_path) == [3, 6, 9]
    stream = data.build(moved.data, tmp_path, task=moved.task, batch_size=8,
                        max_length=moved.max_length, seed=moved.seed, shards=8).train
    for _ in range(8):
        next(stream)
    ninth = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "train"][-1]
    assert ninth["step"] == 9 and ninth["batch_sha1"] == hosts.batch_fingerprint(
        next(stream), hosts.Share(0, 1, 1, 0, 1, 8))["batch_sha1"]
    for name in ("config.json", "tokenizer.model", "tensorboard"):
        assert (tmp_path / name).exists()
    assert not list(tmp_path.rglob("*.orbax-checkpoint-tmp*"))
    results = evaluate.run(tiny_config(files, 9), tmp_path, print_fn=lambda *_: None)
    assert results["step"] == 9 and 0.0 <= results["bleu"] <= 100.0
    assert results["token_perplexity"] > 1.0 and len(results["dropped_fraction"]) == 2
    assert json.loads((tmp_path / "results.json").read_text())["bleu"] == results["bleu"]
    # The checkpoint was written under dp_ep on (2,1,4); it restores under dp_mp_ep on (2,2,2).
    other = tiny_config(files, 9)
    other.layout, other.mesh = "dp_mp_ep", "data:2,model:2,expert:2"
    other.eval.max_examples = 0                     # perplexity only: no translations
    again = evaluate.run(other, tmp_path, print_fn=lambda *_: None)
    assert abs(again["loss"] - results["loss"]) < 1e-4 and again["bleu"] is None
    # measuring less does not erase what the run's own evaluation measured: its own file
    assert json.loads((tmp_path / "results.json").read_text())["bleu"] == results["bleu"]
    (lesser,) = tmp_path.glob("results-*.json")            # results-<its set>-<hash>.json
    assert json.loads(lesser.read_text())["bleu"] is None


def test_fine_tuning_honours_moe_flags_and_the_run_evaluates(files, tmp_path):
    c = tiny_config(files, 3)
    hf_dir = tmp_path / "hf"
    base = switchzoo.zoo.get("switch_base_tiny").replace(vocab_size=512)
    switchzoo.init(base.replace(moe=dataclasses.replace(base.moe, expert_capacity=4)),
                   seed=5).save_pretrained(hf_dir)
    c.init_from = str(hf_dir)
    c.data.vocab_size = 300
    # Routing flags apply to the checkpoint's model: top-2, capacity factors instead of its
    # fixed 4 slots, no load-balancing or z loss (so the loss is the cross entropy alone).
    c.moe.top_k, c.moe.train_capacity_factor = 2, 1.5
    c.moe.aux_loss_weight, c.moe.z_loss_weight, c.moe.jitter = 0.0, 0.0, 0.01
    lines = []
    loop.train(c, tmp_path / "run", print_fn=lines.append)
    assert "from step 0" in lines[1] and logged_steps(tmp_path / "run") == [3]
    saved = json.loads((tmp_path / "run" / "model.json").read_text())["moe"]
    assert (saved["top_k"], saved["train_capacity_factor"], saved["expert_capacity"],
            saved["jitter"]) == (2, 1.5, None, 0.01)
    (row,) = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text(
        ).splitlines()) if r["split"] == "train"]
    assert row["aux_loss"] > 0 and row["loss"] == row["cross_entropy"]
    # eval.py on the fine-tuned run (a model in no catalogue), with overrides of its config.
    config = evaluate.load_config(tmp_path / "run", {
        "eval.num_beams": "1", "eval.max_examples": "4", "data.eval_files": str(files[1])})
    results = evaluate.run(config, tmp_path / "run", print_fn=lambda *_: None)
    assert results["step"] == 3 and results["bleu"] is not None
    assert results["model"] == str(hf_dir) and results["split"] == str(files[1])
    with pytest.raises(ValueError, match=r"--config.moe.top_k cannot change when evaluating"):
        evaluate.load_config(tmp_path / "run", {"moe.top_k": "1"})


def test_moe_flags_that_a_dense_checkpoint_cannot_take_are_refused(files, tmp_path):
    c = tiny_config(files, 3)
    # T5 in the HF format: tied (transformers' T5 always ties the output layer)
    dense = switchzoo.zoo.get("t5_tiny").replace(vocab_size=512, tie_embeddings=True)
    switchzoo.init(dense).save_pretrained(tmp_path / "t5")
    c.init_from, c.data.vocab_size, c.moe.top_k = str(tmp_path / "t5"), 300, 2
    with pytest.raises(ValueError, match=r"--config.moe.top_k set for the dense checkpoint's "
                                         r"model, which has no Switch layers"):
        loop.train(c, tmp_path / "run", print_fn=lambda *_: None)


def test_a_workdir_of_another_model_is_refused_untouched(files, trained, tmp_path):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    before = {p: p.stat().st_mtime_ns for p in pathlib.Path(tmp_path).rglob("*") if p.is_file()}
    other = tiny_config(files, 3)
    other.model = "switch_c_tiny"
    with pytest.raises(ValueError, match="holds a run of model 'switch_base_tiny'"):
        loop.train(other, tmp_path)
    after = {p: p.stat().st_mtime_ns for p in pathlib.Path(tmp_path).rglob("*") if p.is_file()}
    assert before == after
