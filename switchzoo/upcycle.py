"""Sparse upcycling (Komatsuzaki et al. 2022, arXiv 2212.05055; T5X's upcycling checkpointer): a
dense checkpoint becomes a checkpoint of the catalogue's Switch model NAME. Each expert of Switch
layer i is a copy of the dense MLP of layer i, each router is NAME's own fresh initialisation
(transformer.build(NAME, seed)), every other weight is copied. Weights only: the continued run
starts a fresh optimizer and schedule at step 0.

The upcycled model renormalises each token's combine weights over the experts that serve it
(moe.gates_sum_to_one, the paper's app. B.7), so it computes the dense model's function wherever
no token loses an expert to capacity: top-1's gate, the router probability (~1/E for a fresh
router), would otherwise scale every Switch layer's output down ~E times at step 0. Its router
still learns from the loss, through the raw probability (straight-through; routing._sum_to_one).
A run turns it off with --config.moe.gates_sum_to_one=false.

    python -m switchzoo.upcycle --dense DIR --model switch_cpu_8 --out OUT [--seed 0]
    python train.py --config=... --config.model=switch_cpu_8 --config.init_from=OUT \\
        --config.data.vocab_path=OUT/tokenizer.model --workdir=RUN

DIR: a switchzoo workdir (its newest checkpoint) or a Hugging Face SwitchTransformers / T5
directory. OUT: a Hugging Face SwitchTransformers directory (config.json + model.safetensors)
where that format holds NAME (ReLU encoder-decoders), otherwise (decoder-only or gated models)
a switchzoo checkpoint of the weights alone (checkpoints/0, as a run's); either way NAME's full
switchzoo config (model.json: the catalogue's routing and gates_sum_to_one, which the Hugging
Face config cannot hold and init_from prefers) and, from a workdir, the run's tokenizer.model.
OUT appears complete or not at all.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shlex
import shutil
import sys
import uuid

import jax
import numpy as np
from flax import nnx

from switchzoo import checkpoints, cli, hf, transformer, weights, zoo
from switchzoo import state as state_lib
from switchzoo.config import ModelConfig
from switchzoo.data import tokenizer as tokenizer_lib


def target_model(dense: ModelConfig, name: str) -> ModelConfig:
    """Catalogue model ``name`` with the dense model's vocabulary and renormalised gates; a
    ValueError naming both sides where the two differ in anything else that shapes the
    weights."""
    if dense.moe is not None:
        raise ValueError("the dense checkpoint already has Switch layers; upcycle a dense model")
    target = zoo.get(name).replace(vocab_size=dense.vocab_size)
    if target.moe is None:
        raise ValueError(f"{name} is a dense model; upcycle into a Switch model of the "
                         "catalogue (python -m switchzoo.zoo lists them)")
    wrong = weights.differences(target, dense, [f for f in weights.ARCHITECTURE
                                                 if f != "vocab_size"])
    if wrong:
        field, mine, theirs = wrong[0]
        raise ValueError(f"{name} has {field} {mine} but the dense checkpoint has {theirs}")
    # E identical experts are the dense MLP only where a token's gates sum to one (module doc)
    return target.replace(moe=dataclasses.replace(target.moe, gates_sum_to_one=True))


def upcycle_params(dense_params, target: ModelConfig, seed: int = 0) -> dict:
    """``target``'s parameters (a pure dict of numpy arrays, unrolled layers) from the dense
    model's: a dense weight of the same path and shape is copied; an [experts, ...] weight whose
    path holds a dense [...] weight is that weight along the experts dim (the same bits in every
    expert); the rest (the routers) is ``transformer.build(target, seed)``'s."""
    dense = {state_lib.path_name(p): np.asarray(x)
             for p, x in jax.tree_util.tree_leaves_with_path(dense_params)}
    _, abstract, dims = state_lib.abstract_model(target, seed)
    names = [state_lib.path_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(abstract)]
    fresh_names = {n for n in names if n not in dense}
    unexpected = sorted(n for n in fresh_names if "/router/" not in n and "/shared/" not in n)
    if unexpected:
        raise ValueError(f"the dense checkpoint has no weight for {unexpected[0]} (nor "
                         f"{len(unexpected) - 1} more) of the Switch model; upcycle a dense "
                         "model of the same architecture")

    def fresh():       # jitted: XLA computes only the initialisers of what is returned
        params = nnx.to_pure_dict(nnx.state(transformer.build(target, seed)))
        return {state_lib.path_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)
                if state_lib.path_name(p) in fresh_names}
    new = jax.device_get(jax.jit(fresh)())

    def one(path, leaf):
        name = state_lib.path_name(path)
        if name in new:
            return np.asarray(new[name])
        d = dense[name]
        if d.shape == leaf.shape:
            return d
        if dims[name][0] == "experts" and leaf.shape[1:] == d.shape:
            return np.broadcast_to(d, leaf.shape)      # a view: E copies of the same bits
        raise ValueError(f"{name}: the dense checkpoint's {d.shape} is neither {leaf.shape} nor "
                         "one expert of it")
    params = jax.tree_util.tree_map_with_path(one, abstract)
    unused = set(dense) - set(names)
    if unused:
        raise ValueError("the dense checkpoint has weights the Switch model has no place for: "
                         f"{', '.join(sorted(unused)[:4])}")
    return params


def _host_device() -> list:
    try:
        return jax.local_devices(backend="cpu")[:1]
    except RuntimeError:                # a JAX without its CPU backend
        return jax.local_devices()[:1]


def upcycle(dense_dir, model: str, out, seed: int = 0) -> tuple[ModelConfig, bool]:
    """Writes the upcycled checkpoint to ``out`` (a new or empty directory), through a
    temporary sibling renamed at the end. Returns (its model, whether a tokenizer came with
    it)."""
    out = pathlib.Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not an empty directory; give a new one "
                         "(nothing was written)")
    origin = weights.resolve(dense_dir)
    target = target_model(origin.cfg, model)
    try:                             # a model the Hugging Face format cannot hold is written
        hf.config_to_hf(target)      # as a switchzoo checkpoint
        as_hf = True
    except hf.CheckpointError:
        as_hf = False
    setup = state_lib.setup(origin.cfg.replace(scan_layers=False), "data_parallel", "data:1",
                            devices=_host_device())     # one copy, read back to the host
    params = upcycle_params(jax.device_get(origin.load(setup)), target, seed)
    tokenizer = weights.run_tokenizer(origin.path) if origin.is_workdir else None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.upcycling-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        if as_hf:
            hf.save(tmp, target, params)
        else:
            saver = checkpoints.Checkpoints(tmp / "checkpoints", 1, None, use_async=False)
            try:
                saver.save_params(0, params)
            finally:
                saver.close()
        weights.write_model(tmp, target)
        if tokenizer is not None and tokenizer.is_file():
            shutil.copyfile(tokenizer, tmp / tokenizer_lib.CACHE_NAME)
        os.replace(tmp, out)          # onto a missing or empty directory: one rename
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target, (out / tokenizer_lib.CACHE_NAME).is_file()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m switchzoo.upcycle", description=(
        "Turn a dense checkpoint into a Switch one (sparse upcycling): every expert a copy of "
        "its layer's dense MLP, fresh routers, gates renormalised to sum to one per token, "
        "weights only."))
    parser.error = cli.bad_flag
    parser.add_argument("--dense", required=True, help="a switchzoo workdir (its newest "
                        "checkpoint) or a Hugging Face SwitchTransformers / T5 directory")
    parser.add_argument("--model", required=True, help="the catalogue's Switch model to make "
                        "(its layers must match the dense model's; e.g. switch_cpu_8 for t5_cpu)")
    parser.add_argument("--out", required=True, help="a new directory for the checkpoint")
    parser.add_argument("--seed", type=int, default=0, help="seed of the routers' "
                        "initialisation (the model's own, as a fresh run of it with this seed)")
    parser.add_argument("--verbose", action="store_true", help="Show full tracebacks on errors.")
    args = parser.parse_args(argv)
    try:
        target, tokenizer = upcycle(args.dense, args.model, args.out, args.seed)
    except (ValueError, KeyError, FileNotFoundError) as e:
        if args.verbose:
            raise
        print(f"error: {cli.one_line(e)}", file=sys.stderr)
        return 2
    sparse = weights.sparse_layers(target)
    out = pathlib.Path(args.out)
    print(f"upcycled {args.dense} into {out}: {args.model}, {target.moe.num_experts} experts in "
          f"{sum(map(len, sparse.values()))} of {target.num_encoder_layers + target.num_layers} "
          f"feed-forward layers, routers from seed {args.seed}, each token's gates summing to one")
    vocab = (f" --config.data.vocab_path={shlex.quote(str(out / tokenizer_lib.CACHE_NAME))}"
             if tokenizer else "")
    print("continue training it (fresh optimizer, step 0) with the dense run's config:\n"
          f"  python train.py --config=CONFIG --config.model={args.model} "
          f"--config.init_from={shlex.quote(str(out))}{vocab} --workdir=NEW_WORKDIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
