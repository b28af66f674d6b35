"""Distillation (Switch Transformer sec. 4.2): the mixed objective against a numpy formula, the
student's start from the teacher's non-expert weights, bad teachers refused in one line before
anything is written, and a short student run of a tiny teacher run made here."""
import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from switchzoo import distill, loop, state, steps, zoo
from switchzoo.config import ModelConfig, MoeConfig
from switchzoo.configs import mini
from switchzoo.data import tokenizer as tokenizer_lib

WORDS = ("the cat dog sat ran on a mat log red big small and then it was very happy sad "
         "bird fish swam flew over under tree house").split()


def texts(n: int, seed: int, words=WORDS) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, rng.integers(4, 12))) for _ in range(n)]


def run_config(tmp: pathlib.Path, model: str, steps_: int = 2):
    """A tiny LM run on a generated text file: seconds, not minutes."""
    corpus = tmp / "corpus.txt"
    if not corpus.is_file():
        corpus.write_text("\n".join(texts(400, 0)) + "\n")
    c = mini.get_config(f"model={model},steps={steps_}")
    c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps = 1, 0, steps_
    c.per_device_batch_size, c.max_length = 1, 16
    c.data.source, c.data.train_files, c.data.vocab_size = "files", str(corpus), 48
    c.data.pair = "en-de"                 # the default: read by the embedded corpus only
    return c


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> pathlib.Path:
    """A teacher run of one step: a two-layer dense LM (training a Switch teacher compiles for
    ~8 s more; test_the_step_runs_a_switch_teacher_in_evaluation_mode runs one)."""
    tmp = tmp_path_factory.mktemp("distill")
    loop.train(run_config(tmp, "mtf_lm1b_tiny", 1), tmp / "teacher", print_fn=lambda *_: None)
    return tmp / "teacher"


CFG = ModelConfig(vocab_size=40, d_model=8, num_heads=1, d_kv=8, d_ff=8, num_layers=2,
                  moe=MoeConfig(num_experts=2))


def tiny_batch():
    rng = np.random.default_rng(0)
    student = (rng.standard_normal((2, 3, 40)) * 3).astype(np.float32)
    teacher_ = (rng.standard_normal((2, 3, 40)) * 2).astype(np.float32)
    targets = rng.integers(0, 40, (2, 3)).astype(np.int32)
    weights = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], np.float32)     # one padding token
    return student, teacher_, {"targets": targets, "weights": weights}


def log_softmax(x):
    x = x.astype(np.float64)
    return x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(
        -1, keepdims=True))


@pytest.mark.parametrize("weight, smoothing", [(0.25, 0.0), (0.7, 0.1)])
def test_loss_is_the_mix_of_label_and_teacher_cross_entropies(weight, smoothing):
    student, teacher_, batch = tiny_batch()
    aux = {"aux_loss": jnp.float32(0.7), "z_loss": jnp.float32(2.0)}
    loss, m = steps.distill_objective(student, teacher_, batch, aux, CFG, weight, smoothing)
    w, logq = batch["weights"], log_softmax(student)
    label = np.eye(40)[batch["targets"]] * (1 - smoothing) + smoothing / 40   # labels only
    p = np.exp(log_softmax(teacher_))
    ce = (-(label * logq).sum(-1) * w).sum() / w.sum()
    soft = (-(p * logq).sum(-1) * w).sum() / w.sum()
    routing = CFG.moe.aux_loss_weight * 0.7 + CFG.moe.z_loss_weight * 2.0
    np.testing.assert_allclose(float(m["distill_ce"]), soft, rtol=1e-6)
    np.testing.assert_allclose(float(m["cross_entropy"]), ce, rtol=1e-6)
    np.testing.assert_allclose(float(loss), (1 - weight) * ce + weight * soft + routing,
                               rtol=1e-6)
    assert float(m["loss"]) == float(loss)


def test_weight_zero_is_exactly_the_plain_objective():
    student, teacher_, batch = tiny_batch()
    aux = {"aux_loss": jnp.float32(0.7), "z_loss": jnp.float32(2.0)}
    plain, _ = steps.lm_objective(student, batch, aux, CFG, 0.1)
    mixed, _ = steps.distill_objective(student, teacher_, batch, aux, CFG, 0.0, 0.1)
    assert float(mixed) == float(plain)


def random_params(model, seed: int, shardings=None):
    """Random parameters of a model (name or ModelConfig), as numpy arrays or, given their
    shardings, placed (no init program to compile)."""
    _, abstract, dims = state.abstract_model(zoo.get(model) if isinstance(model, str) else model)
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda a: (rng.standard_normal(a.shape) * 0.3).astype(a.dtype),
                          abstract)
    return (params if shardings is None else jax.device_put(params, shardings)), dims


def flat(params) -> dict:
    return {state.path_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}


@pytest.mark.parametrize("student_model", ["dense_tiny", "switch_tiny"])
def test_the_student_starts_from_the_teachers_non_expert_weights(student_model):
    teacher_params, teacher_dims = random_params("switch_tiny", 0)
    student_params, _ = random_params(student_model, 1)
    new, copied = distill.copy_from_teacher(student_params, teacher_params, teacher_dims)
    switch = {f"decoder/layers/{i}/ffn" for i in (1, 3)}        # switch_tiny's Switch layers
    assert distill.teacher_switch_modules(teacher_dims) == switch
    fresh = {p for p in flat(student_params) if p.rsplit("/", 2)[0] in switch
             or p.rsplit("/", 1)[0] in switch}
    assert fresh and set(copied) == set(flat(student_params)) - fresh
    t, s, n = flat(teacher_params), flat(student_params), flat(new)
    for p in n:     # bitwise: the teacher's where copied, the student's own elsewhere
        np.testing.assert_array_equal(n[p], t[p] if p in copied else s[p], err_msg=p)


def test_a_short_distillation_run_writes_both_terms_and_resumes_without_reinit(teacher):
    workdir = teacher.parent / "student"
    lines = []
    config = run_config(teacher.parent, "mtf_lm1b_tiny")    # the teacher's init compiled once
    config.distill.teacher = str(teacher)
    loop.train(config, workdir, print_fn=lines.append)
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["distill_ce"] > 0 and r["cross_entropy"] > 0
        np.testing.assert_allclose(r["loss"], 0.75 * r["cross_entropy"] + 0.25 * r["distill_ce"],
                                   rtol=1e-5)
    copied = [x for x in lines if x.startswith("distill: copied")]
    # a dense teacher of the student's shape: every tensor (which ones, and not the Switch
    # layers' FFNs: test_the_student_starts_from_the_teachers_non_expert_weights)
    assert len(copied) == 1 and "copied 20 of 20 tensors" in copied[0], lines
    saved = json.loads((workdir / "config.json").read_text())        # the teacher's tokenizer
    assert saved["data"]["vocab_path"] == str((teacher / tokenizer_lib.CACHE_NAME).resolve())
    lines.clear()
    loop.train(config, workdir, print_fn=lines.append)     # resumed (nothing left to run)
    assert not any(x.startswith("distill: copied") for x in lines), lines
    assert any("resuming at step 2" in x for x in lines), lines   # the checkpoint wins


def test_weight_zero_starts_from_the_teacher_and_leaves_it_out_of_the_step(teacher):
    """distill.weight 0 (the routing family's student_init): the student starts from the
    teacher's weights, and its step is the labels' objective without the teacher's forward pass
    (the same loss: test_weight_zero_is_exactly_the_plain_objective)."""
    workdir, lines = teacher.parent / "student_init", []
    config = run_config(teacher.parent, "mtf_lm1b_tiny", 1)
    config.distill.teacher, config.distill.weight = str(teacher), 0.0
    loop.train(config, workdir, print_fn=lines.append)
    assert any(x.startswith("distill: copied") for x in lines), lines
    assert any(x.startswith("distill.weight 0: teacher ") and "started the student" in x
               for x in lines), lines
    assert not any(x.startswith("distilling teacher") for x in lines), lines
    (row,) = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert "distill_ce" not in row                   # the teacher did not run in the step
    assert row["loss"] == pytest.approx(row["cross_entropy"], rel=1e-6)


def test_the_step_runs_a_switch_teacher_in_evaluation_mode():
    """The teacher's parameters are an argument of the one jitted step (in their own
    shardings, not donated, not constants), and it runs in evaluation mode: its probabilities
    do not depend on the step's key, where in training its router jitter and a capacity of
    one slot per expert (drops) would make them."""
    moe = MoeConfig(num_experts=4, group_size=16, train_capacity_factor=0.25,
                    eval_capacity_factor=4.0, min_capacity=1, jitter=0.5)
    teacher_cfg = ModelConfig(vocab_size=128, d_model=16, num_heads=2, d_kv=8, d_ff=16,
                              num_layers=2, moe=moe)
    t = state.setup(teacher_cfg, "dp_ep", "data:2,model:1,expert:4")
    s = state.setup(dataclasses.replace(teacher_cfg, moe=None), t.layout, optimizer="adamw")
    teacher_params, _ = random_params(teacher_cfg, 0, t.param_shardings)
    ids = np.random.default_rng(3).integers(1, 128, (8, 8)).astype(np.int32)
    batch = {"inputs": ids, "targets": np.roll(ids, -1, 1),
             "weights": (np.arange(8) < 6).astype(np.float32)[None].repeat(8, 0)}
    step = steps.make_train_step(s, teacher=t, distill_weight=0.5)
    rows = []
    for at in (0, 5):           # the same student (dense, no dropout) at two steps: two keys
        student = s.state_from(random_params(s.cfg, 1, s.param_shardings)[0])
        student = student._replace(step=jnp.asarray(at, jnp.int32))
        if not rows:
            lowered = step.lower(student, batch, teacher_params)
            args = lowered.args_info[0]           # (state, batch, teacher_params)
            assert all(a.donated for a in jax.tree.leaves(args[0]))
            assert not any(a.donated for a in jax.tree.leaves(args[2]))
        rows.append(jax.device_get(step(student, batch, teacher_params)[1]))
    assert rows[0]["distill_ce"] == rows[1]["distill_ce"] > 0
    np.testing.assert_allclose(rows[0]["loss"], 0.5 * rows[0]["cross_entropy"]
                               + 0.5 * rows[0]["distill_ce"], rtol=1e-6)
    assert all(not x.is_deleted() for x in jax.tree.leaves(teacher_params))


def other_tokenizer(path: pathlib.Path, pieces: int, seed: int) -> str:
    words = [w + w[::-1] for w in WORDS]           # other text: other pieces
    path.write_bytes(tokenizer_lib.train(texts(300, seed, words), pieces))
    return str(path)


@pytest.mark.parametrize("case, message", [
    ("not a run", "is not a switchzoo run (a run's workdir holds config.json and checkpoints/)"),
    ("another task", ("was trained on task 'lm' (a decoder-only model), the student's task "
                      "is 'translation' (encoder-decoder)")),
    ("another vocabulary", "has a vocabulary of 148 ids, the student 150 ("),
    ("another tokenizer", "reads text with the tokenizer"),
    ("another form", "has scan_layers=False, the student True: the student starts from the "
                     "teacher's weights by parameter path"),
])
def test_bad_teachers_are_refused_in_one_line_before_anything_is_written(teacher, tmp_path,
                                                                         case, message):
    config = run_config(teacher.parent, "dense_tiny")
    config.distill.teacher = str(teacher)
    if case == "not a run":
        config.distill.teacher = str(tmp_path)
    elif case == "another task":
        config.task, config.model = "translation", "switch_base_tiny"
    elif case == "another form":
        config.scan_layers = True
    elif case == "another vocabulary":
        config.data.vocab_path = other_tokenizer(tmp_path / "other.model", 50, 1)
    else:
        config.data.vocab_path = other_tokenizer(tmp_path / "other.model", 48, 2)
    workdir = tmp_path / "student"
    with pytest.raises(ValueError) as e:
        loop.train(config, workdir, print_fn=lambda *_: None)
    text = str(e.value)
    assert message in text and "\n" not in text, text
    if case in ("another vocabulary", "another tokenizer"):
        assert f"--config.data.vocab_path={teacher / 'tokenizer.model'}" in text
    assert not workdir.exists()
