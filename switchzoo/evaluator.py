"""Evaluate a run (its newest checkpoint) or a Hugging Face directory: loss, token and word
perplexity, Switch load and drops at the evaluation capacity factor, and for translation BLEU of
detokenized beam-search output. Writes workdir/results.json."""
from __future__ import annotations

import json
import pathlib

import jax
import ml_collections
import numpy as np

from switchzoo import api, checkpoints, data, evaluation, hf, training, trainer


def load_config(workdir: pathlib.Path) -> ml_collections.ConfigDict:
    path = workdir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{workdir} has no config.json (not a training run); pass the "
                                "workdir of a run, or --checkpoint=HF_DIR with --config")
    return ml_collections.ConfigDict(json.loads(path.read_text()))


def restore_params(config, workdir: pathlib.Path, layout, vocab_size: int):
    """(cfg, graphdef, params, step) of the newest committed checkpoint of the run."""
    cfg = trainer.model_config(config, vocab_size)
    tx = training.make_optimizer(config.optimizer, config.learning_rate, config.warmup_steps,
                                 config.weight_decay)
    graphdef, abstract, dims = training.abstract_state(cfg, tx, config.seed)
    shardings = training.tree_shardings(layout, abstract, dims, abstract.params,
                                        "data" if config.shard_optimizer_over_data else None)
    ckpt = checkpoints.Checkpoints(workdir / "checkpoints", 1, config.keep_checkpoints)
    step = ckpt.latest_step()
    if step is None:
        raise FileNotFoundError(f"{workdir / 'checkpoints'} holds no complete checkpoint; train "
                                "first (python train.py --workdir=...)")
    state, _ = ckpt.restore(step, abstract, shardings)
    ckpt.close()
    return cfg, graphdef, state.params, step


def run(config, workdir, checkpoint: str = "", print_fn=print) -> dict:
    workdir = pathlib.Path(workdir)
    layout = trainer.setup_mesh(config)
    batch = trainer.batch_size(config)
    ds = data.build(config.data, workdir, task=config.task, batch_size=batch,
                    max_length=config.max_length, seed=config.seed)
    if checkpoint:
        hf_config, cfg, files = hf.read_config(checkpoint)
        graphdef, params, _ = hf.load_params(cfg, files, layout)
        step = None
    else:
        cfg, graphdef, params, step = restore_params(config, workdir, layout,
                                                     ds.tokenizer.vocab_size)
    eval_fn = training.make_eval_step(graphdef, cfg, layout, jax.tree.map(lambda x: x.sharding,
                                                                         params))
    results = {"step": step, "split": config.data.eval_split, "model": config.model,
               **trainer.evaluate_loss(eval_fn, params, ds, layout)}
    results["bleu"] = None
    if config.task == "translation":
        model = api.Model(cfg, graphdef, params, layout)
        hyps = translate(model, ds, [s for s, _ in ds.eval_examples[:config.eval.max_examples]],
                         config, batch)
        refs = [t for _, t in ds.eval_examples[:config.eval.max_examples]]
        results["bleu"] = evaluation.bleu(hyps, refs)
        results["examples"] = [{"source": s, "reference": r, "output": h} for (s, r), h in
                               zip(ds.eval_examples[:3], hyps[:3])]
    evaluation.write_results(workdir, results)
    print_fn(evaluation.markdown(results))
    for ex in results.get("examples", []):
        print_fn(f"\n  source:    {ex['source']}\n  reference: {ex['reference']}\n"
                 f"  output:    {ex['output']}")
    return results


def translate(model: api.Model, ds, sources: list[str], config, batch: int) -> list[str]:
    """Beam-search translations of ``sources``, detokenized, in order."""
    L = config.max_length
    out = []
    for i in range(0, len(sources), batch):
        chunk = sources[i:i + batch]
        ids = np.zeros((batch, L), np.int32)
        for row, text in enumerate(chunk):
            tokens = ds.tokenizer.encode(text)[:L - 1] + [ds.tokenizer.eos_id]
            ids[row, :len(tokens)] = tokens
        generated = model.generate(ids, attention_mask=(ids != 0).astype(np.int32),
                                   max_new_tokens=config.eval.max_decode_length,
                                   num_beams=config.eval.num_beams,
                                   length_penalty=config.eval.length_penalty,
                                   eos_token_id=ds.tokenizer.eos_id)
        out += [ds.tokenizer.decode(list(g[1:])) for g in generated[:len(chunk)]]
    return out
