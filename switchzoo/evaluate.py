"""Evaluate a run (its newest checkpoint's parameters) or a Hugging Face directory: loss, token
and word perplexity, Switch load and drops at the evaluation capacity factor, and for
translation BLEU of detokenized beam-search output. Writes workdir/results.json.

Running the model lives here; the scores themselves (BLEU, perplexities, results.json) are
pure functions in switchzoo.scores."""
from __future__ import annotations

import json
import pathlib

import jax
import ml_collections
import numpy as np

from switchzoo import (api, atomic, checkpoints, data, finetune, hosts, machine, record, resume,
                       scores, steps, validate, weights)
from switchzoo import state as state_lib
from switchzoo import workdir as workdir_lib
from switchzoo.config import ModelConfig
from switchzoo.configs import base

TRANSLATIONS_FILE = "translations.txt"    # eval's beam-search output, one line per example
MODEL_FILE = weights.MODEL_FILE      # the run's resolved model, written by the training loop
# What an evaluation may change in a run's saved config (--config.FIELD=value): where and how
# it evaluates, never what was trained.
EVAL_OVERRIDES = ("eval.", "data.eval_files", "data.eval_split", "data.max_eval_examples",
                  "data.tfds_data_dir", "data.locale_dir", "data.info_dir",
                  "per_device_batch_size", "layout", "mesh", "dtype", "moe.eval_capacity_factor",
                  "moe.dispatch", "moe.grouped_matmul", "moe.block_size", "moe.eval_groups",
                  "restore_step", "finetune.eval_split", "finetune.data_dir",
                  "finetune.eval_files")


def load_config(workdir: pathlib.Path,
                overrides: dict | None = None) -> ml_collections.ConfigDict:
    """The run's saved config on top of today's defaults, with ``overrides`` ({dotted field:
    text}) of the fields in EVAL_OVERRIDES."""
    path = workdir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{workdir} has no config.json (not a training run); pass the "
                                "workdir of a run, or --checkpoint=HF_DIR with --config")
    config = base.get_base()
    config.update(record.read_config(workdir))   # recursive: nested dicts update in place
    defaults = base.get_base()              # what the run did not read (older runs kept some)
    config.update_from_flattened_dict({f: validate.get(defaults, f)
                                       for f in validate.unread(config)})
    return apply_overrides(config, overrides)


def apply_overrides(config, overrides: dict | None) -> ml_collections.ConfigDict:
    """``config`` with ``overrides`` ({dotted field: text}) set, each a field of
    EVAL_OVERRIDES (else a ValueError: it defines what was trained), typed as the field is."""
    for key, text in (overrides or {}).items():
        if not any(key == k or (k.endswith(".") and key.startswith(k)) for k in EVAL_OVERRIDES):
            allowed = ", ".join(k + "*" if k.endswith(".") else k for k in EVAL_OVERRIDES)
            raise ValueError(f"--config.{key} cannot change when evaluating a trained run (it "
                             f"defines what was trained); eval.py may set {allowed}")
        base.set_field(config, key, text)
    return config


def run_model(config, workdir: pathlib.Path, vocab_size: int,
              pieces: int | None = None) -> ModelConfig:
    """The model a run trained: the one it saved, else (older runs) its Hugging Face starting
    point or its catalogue entry; with the config's evaluation-time overrides."""
    saved = workdir / MODEL_FILE
    if saved.is_file():
        model = weights.read_model(saved)
    else:
        model = weights.resolve(config.init_from).cfg if config.init_from else None
    return state_lib.run_model_config(config, vocab_size, model, pieces)


def restore_params(config, workdir: pathlib.Path, layout, vocab_size: int,
                   pieces: int | None = None):
    """(setup, params, step) of the newest committed checkpoint of the run (or restore_step's):
    the parameters alone, with no optimizer built; a damaged one named in one line with the
    newest step that restores (switchzoo.resume)."""
    setup = state_lib.setup_run(config, layout, run_model(config, workdir, vocab_size, pieces),
                                train=False)
    ckpt = checkpoints.Checkpoints(workdir / "checkpoints", 1, config.keep_checkpoints,
                                   read_only=True)      # a run may be training meanwhile

    def load(s):
        return ckpt.restore_params(s, setup.abstract, setup.shardings)
    try:
        step, params = resume.read_newest(
            ckpt, config.get("restore_step"), load,
            lambda s, e: resume.explain(ckpt, s, e, load, {"params": setup.abstract}, "evaluate"))
        if step is None:
            raise FileNotFoundError(f"{workdir / 'checkpoints'} holds no complete checkpoint; "
                                    "train first (python train.py --workdir=...)")
    finally:
        ckpt.close()
    return setup, params, step


def evaluate_loss(eval_fn, params, ds, layout, share: hosts.Share) -> dict:
    """Token (and, for text with word counts, word) perplexity over the whole eval split, and
    the Switch metrics over its batches, weighted by the tokens each layer routed (a batch of
    padding, as the filler batches of a process with a shorter share, counts for nothing). Each
    process tokenizes only the parts of the eval set its batch shards hold (``share``); the
    sums are the global batch's."""
    count = max(hosts.allgather_json(ds.eval_batch_count(share.shards, share.local_shards),
                                     share.processes))
    totals, moe = {"nll": 0.0, "tokens": 0.0, "correct": 0.0, "words": 0.0}, {}
    for batch in ds.eval_batches(share.shards, share.local_shards, count):
        out = jax.device_get(eval_fn(params, hosts.assemble(batch, layout, share)))
        for k in totals:
            totals[k] += float(out[k])
        for k in ("dropped_fraction", "expert_load", "routed_tokens"):
            if k in out:
                moe[k] = moe.get(k, 0) + np.asarray(out[k], np.float64)
    result = scores.perplexities(totals["nll"], int(totals["tokens"]),
                                 int(totals["words"]) or None)
    result["accuracy"] = round(totals["correct"] / totals["tokens"], 5)
    routed_L = np.maximum(moe.pop("routed_tokens", 1.0), 1.0)        # [Switch layers]
    for k, v in moe.items():
        weight = routed_L.reshape(routed_L.shape + (1,) * (v.ndim - 1))
        result[k] = (v / weight).round(5).tolist()
    return result


def run(config, workdir, checkpoint: str = "", print_fn=print, output: str = "") -> dict:
    """Evaluates on every process of the run (each reads its share of the eval set); process 0
    writes results.json and prints. ``output``: the directory for the results files instead of
    the workdir (a run on a read-only mount; without it such a run is refused before it is
    evaluated). Reads committed checkpoints only, so a run may be evaluated while it trains."""
    workdir = pathlib.Path(workdir)
    if jax.process_count() > 1:
        hosts.check_same_config(config.to_json_best_effort(sort_keys=True) + checkpoint)
    validate.check(config, evaluating=True)
    # one results file per evaluation set: the run's own held-out results are never replaced
    results_file, translations_file, eval_set = record.results_names(config, workdir)
    out = pathlib.Path(output).expanduser() if output else workdir
    why = workdir_lib.not_writable(out)
    if why:                 # before the evaluation, not after it
        raise workdir_lib.Refused(
            f"{why}: eval.py writes {results_file} there; give --output=DIR, a directory it can "
            "write, for the results (they are printed too)" if not output else
            f"{why}: --output={output} must be a directory eval.py can write")
    layout = state_lib.run_layout(config)
    share = hosts.agreed_share(layout, state_lib.global_batch_size(config))
    lead = share.process == 0
    ds = data.build(config.data, workdir, task=config.task, batch_size=share.rows,
                    max_length=config.max_length, seed=config.seed, evaluating=True, run=config)
    best = finetune.best_record(workdir) if config.task == "text2text" else None
    if not checkpoint and best:
        checkpoint = str(workdir / finetune.BEST_DIR)    # a fine-tune is scored at its best
    if checkpoint:
        origin = weights.resolve(checkpoint)
        setup = state_lib.setup(origin.cfg, layout)
        params = origin.load(setup)
        step = None
    else:
        setup, params, step = restore_params(config, workdir, layout, ds.tokenizer.vocab_size,
                                             ds.tokenizer.num_pieces)
    eval_fn = steps.make_eval_step(setup)
    results = {"step": step, "split": ds.eval_split,
               "model": config.init_from or config.model,
               **evaluate_loss(eval_fn, params, ds, layout, share)}
    results["bleu"] = None
    if config.task == "translation" and config.eval.max_examples:    # 0: perplexity only
        model = api.Model(setup.cfg, setup.graphdef, params, layout)
        hyps = translate(model, ds, [s for s, _ in ds.eval_examples[:config.eval.max_examples]],
                         config, share)
        refs = [t for _, t in ds.eval_examples[:config.eval.max_examples]]
        results["bleu"] = scores.bleu(hyps, refs)
        results["examples"] = [{"source": s, "reference": r, "output": h} for (s, r), h in
                               zip(ds.eval_examples[:3], hyps[:3])]
    outputs = None
    if config.task == "text2text":
        model = api.Model(setup.cfg, setup.graphdef, params, layout)
        scored = finetune.score(model, ds, config, share, translate)
        outputs = {t: r["_outputs"] for t, r in scored.items()}
        results["tasks"] = finetune.public(scored)
        results["task_score"] = finetune.paper_score(scored)
        results["checkpoint"] = checkpoint or "newest"
        if best and pathlib.Path(checkpoint) == workdir / finetune.BEST_DIR:
            results["step"] = best["step"]
    results["machine"] = machine.describe()      # XLA:CPU's figures depend on the CPU
    if not lead:
        return results
    if results["bleu"] is not None:     # every hypothesis, in eval-set order (for sacrebleu & co)
        atomic.write_text(out / translations_file,
                          "".join(" ".join(h.split()) + "\n" for h in hyps))
    if outputs is not None:       # every output, in eval-set order, beside its example
        predictions = "predictions" + results_file.removeprefix("results") + "l"  # .jsonl
        atomic.write_text(out / predictions, "".join(
            json.dumps({"task": t.name, "inputs": e.inputs, "reference": e.reference,
                        "output": o}) + "\n"
            for t, examples in ds.task_examples.items() for e, o in zip(examples, outputs[t.name])))
    scores.write_results(out, results, results_file)
    print_fn(scores.markdown(results))
    print_fn(f"results: {out / results_file} ({eval_set}"
             + (")" if results_file == scores.RESULTS_FILE else
                f"; the run's own stay in {scores.RESULTS_FILE})"))
    print_fn(f"machine: {machine.line(results['machine'])}, {jax.default_backend()} backend")
    for ex in results.get("examples", []):
        print_fn(f"\n  source:    {ex['source']}\n  reference: {ex['reference']}\n"
                 f"  output:    {ex['output']}")
    return results


def translate(model: api.Model, ds, sources: list[str], config,
              share: hosts.Share, max_new: int | None = None,
              beams: int | None = None) -> list[str]:
    """Beam-search translations of ``sources``, detokenized, in order (``max_new`` tokens and
    ``beams`` beams where given, else config.eval's; 1 beam: greedy). The sources are cut
    into one contiguous part per batch shard (as the eval batches are); each process tokenizes
    the parts of its shards, the global batch is decoded on the mesh, and every process gets
    the decoded ids of the whole batch back (a few KB) to detokenize."""
    L, per = config.max_length, share.rows_per_shard
    bounds = [data.part(len(sources), share.shards, s) for s in range(share.shards)]
    out: list[str | None] = [None] * len(sources)
    for k in range(max(-(-(hi - lo) // per) for lo, hi in bounds)):
        ids = np.zeros((per * share.count, L), np.int32)
        for i, shard in enumerate(share.local_shards):
            lo, hi = bounds[shard]
            for row, text in enumerate(sources[lo + k * per:min(hi, lo + (k + 1) * per)]):
                tokens = ds.tokenizer.encode(text)[:L - 1] + [ds.tokenizer.eos_id]
                ids[i * per + row, :len(tokens)] = tokens
        batch = hosts.assemble({"ids": ids, "mask": (ids != 0).astype(np.int32)},
                               model.layout, share)
        generated = hosts.gather(model.new_tokens(
            batch["ids"], batch["mask"], max_new or config.eval.max_decode_length,
            beams or config.eval.num_beams,
            length_penalty=config.eval.length_penalty, eos_token_id=ds.tokenizer.eos_id))
        for shard, (lo, hi) in enumerate(bounds):
            for row in range(per):
                index = lo + k * per + row
                if index < hi:
                    out[index] = ds.tokenizer.decode(list(generated[shard * per + row]))
    return out
