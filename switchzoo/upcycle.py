"""Sparse upcycling (Komatsuzaki et al. 2022, arXiv 2212.05055; T5X's upcycling checkpointer): a
dense checkpoint becomes a checkpoint of the catalogue's Switch model NAME. Each expert of Switch
layer i is a copy of the dense MLP of layer i, each router is NAME's own fresh initialisation
(transformer.build(NAME, seed)), every other weight is copied.

Where the continued run starts (``--continue``; CONTINUE):
  weights    a fresh optimizer and schedule at step 0 (the default; what switchzoo always did);
  schedule   the dense run's step S: the schedule goes on from S + 1 (every optimizer count is
             S), the optimizer state fresh. T5X's sparse_upcycle.gin, the paper's language
             runs: its assignment map restores state/step and drops state/param_states;
  optimizer  the step as ``schedule``, and the dense run's optimizer state: each expert's
             moments a copy of its layer's dense MLP's, every other weight's its own, the
             routers' fresh. The paper's Figure 1 ("optionally their optimizer state"), which it
             found to help its vision models and not its language models (sec. 2.2, app. B).
A fresh statistic at a late step gets that step's decay: Adafactor's 1 - beta2 = t^-0.8 is
small, so the router's first updates are the clipped ones (RMS 1 x the relative step), as every
weight's are in the paper's language runs.

The upcycled model renormalises each token's combine weights over the experts that serve it
(moe.gates_sum_to_one, the paper's app. B.7), so it computes the dense model's function wherever
no token loses an expert to capacity: top-1's gate, the router probability (~1/E for a fresh
router), would otherwise scale every Switch layer's output down ~E times at step 0. A run turns
it off with --config.moe.gates_sum_to_one=false. The renormalised top-1 gate is the constant 1,
so its router learns from the aux and z losses alone: the "vanishing routing gradient" the
paper notes in B.7 and keeps (it has no straight-through estimator), and the default here
(moe.straight_through_steps 0). ``--straight-through-steps N`` (or the run's
--config.moe.straight_through_steps) instead trains the router for the continued run's first N
steps (-1: all of them) as if the gate were the raw probability, while the forward pass uses
the renormalised one (straight-through; routing._sum_to_one).

    python -m switchzoo.upcycle --dense DIR --model switch_cpu_8 --out OUT [--seed 0] \
        [--continue weights|schedule|optimizer] [--straight-through-steps 0]
    python train.py --config=... --config.model=switch_cpu_8 --config.init_from=OUT \\
        --config.data.vocab_path=OUT/tokenizer.model --workdir=RUN

DIR: a switchzoo workdir (its newest checkpoint) or a Hugging Face SwitchTransformers / T5
directory. OUT: a switchzoo checkpoint of the weights alone (checkpoints/0, as a run's), NAME's
full switchzoo config (model.json: the catalogue's routing and gates_sum_to_one, which
init_from reads) and, from a workdir, the run's tokenizer.model. Not a Hugging Face directory:
that format cannot say gates_sum_to_one (hf.refusal), and transformers would scale each
expert's output by the raw router probability, another model. OUT appears complete or not at
all.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shlex
import shutil
import sys
import uuid

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from switchzoo import checkpoints, errors, hf, tensorfile, transformer, weights, zoo
from switchzoo import state as state_lib
from switchzoo.config import ModelConfig
from switchzoo.data import tokenizer as tokenizer_lib


CONTINUE = ("weights", "schedule", "optimizer")
CONTINUE_FILE = "upcycled.json"          # {"continue": CONTINUE[i], "step": S}
MOMENTS_FILE = "dense_optimizer.safetensors"  # "STAT:param/path" -> the dense run's statistic


def target_model(dense: ModelConfig, name: str, straight_through_steps: int = 0) -> ModelConfig:
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
    return target.replace(moe=dataclasses.replace(target.moe, gates_sum_to_one=True,
                                                  straight_through_steps=straight_through_steps))


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


def _nest(flat: dict) -> dict:
    """{'decoder/layers/1/ffn/wi': x} -> the nested pure dict (layer indices as ints)."""
    tree = {}
    for name, x in flat.items():
        *parents, leaf = [int(k) if k.isdigit() else k for k in name.split("/")]
        node = tree
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = x
    return tree


def _flat(tree) -> dict:
    return {state_lib.path_name(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _by_statistic(opt_state, names) -> dict[str, dict]:
    """{statistic ('mu', 'v_row', ...): {parameter path: array}} of an optimizer state of any
    nesting: a leaf whose path ends with a parameter's path (in ``names``) after one key."""
    stats = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state):
        keys = state_lib.path_name(path).split("/")
        for i in range(len(keys) - 1):
            if "/".join(keys[i + 1:]) in names:
                stats.setdefault(keys[i], {})["/".join(keys[i + 1:])] = leaf
                break
    return stats


def dense_moments(origin: weights.Origin, step: int) -> dict[str, np.ndarray]:
    """The dense run's optimizer statistics in checkpoint ``step``, {"STAT:param/path": array},
    layers unrolled (a scanned run's stacks split), read without rebuilding its optimizer."""
    ckpt = checkpoints.Checkpoints(origin.path / "checkpoints", 1, None)
    try:
        saved = ckpt.manager.restore(step, args=ocp.args.Composite(
            optimizer=ocp.args.StandardRestore()))
    finally:
        ckpt.close()
    names = set(state_lib.abstract_model(origin.cfg)[2])
    stats = _by_statistic(jax.device_get(saved.optimizer["opt_state"]), names)
    if not stats:
        raise ValueError(f"checkpoint {step} of {origin.path} holds no optimizer statistics of "
                         "its parameters; upcycle with --continue schedule or weights")
    unrolled = origin.cfg.replace(scan_layers=False)
    return {f"{stat}:{name}": np.asarray(x) for stat, flat in stats.items()
            for name, x in _flat(transformer.layers_as(_nest(flat), unrolled)).items()}


def expert_moments(dense: dict[str, np.ndarray], setup: state_lib.Setup) -> dict:
    """``setup``'s model's statistics from the dense run's (dense_moments): an expert weight's
    are its dense MLP's in every expert (the experts dim first, as optim.per_layer slices
    it), every other weight's its own, none for the routers; in the set-up's layer form."""
    _, _, dims = state_lib.abstract_model(setup.cfg.replace(scan_layers=False))
    stats = {}
    for key, x in dense.items():
        stat, name = key.split(":", 1)
        if name in dims:
            if dims[name][0] == "experts":
                x = np.broadcast_to(x, (setup.cfg.moe.num_experts,) + x.shape)
            stats.setdefault(stat, {})[name] = x
    return {f"{stat}:{name}": x for stat, flat in stats.items()
            for name, x in _flat(transformer.layers_as(_nest(flat), setup.cfg)).items()}


def continued_state(origin: weights.Origin, setup: state_lib.Setup, state):
    """The continued run's state at its start from ``state`` (fresh, around the upcycled
    weights), as the upcycling's ``--continue`` asked (CONTINUE_FILE): (state, what it is)."""
    path = origin.path / CONTINUE_FILE
    if not path.is_file():
        return state, "a fresh optimizer from step 0"
    saved = json.loads(path.read_text())
    step, how = int(saved["step"]), saved["continue"]
    moments = {}
    if how == "optimizer":
        f = tensorfile.TensorFile(origin.path / MOMENTS_FILE)
        moments = expert_moments({k: f.get(k) for k in f.names()}, setup)
    names = set(setup.dims)

    def one(keys, leaf):
        keys = state_lib.path_name(keys).split("/")
        if keys[-1] == "count":                  # every schedule and decay goes on from S
            return np.full(leaf.shape, step, leaf.dtype)
        i = next((i for i in range(len(keys) - 1) if "/".join(keys[i + 1:]) in names), None)
        name = None if i is None else "/".join(keys[i + 1:])
        if not moments or name is None or "/router/" in f"/{name}":
            return leaf                          # fresh: no moments asked for, or a router's
        x = moments.get(f"{keys[i]}:{name}")
        if x is None and keys[i] == "ema":       # expert_momentum's average: the dense run
            return leaf                          # had none, it starts from zero
        if x is None or x.shape != leaf.shape:
            stats = sorted({k.split(":")[0] for k in moments})
            raise ValueError(f"{origin.path} holds the dense run's {'/'.join(stats)} optimizer "
                             f"statistics, which do not fit this run's {name} "
                             f"({leaf.shape}); continue with the dense run's --config.optimizer, "
                             "or upcycle with --continue schedule")
        return x.astype(leaf.dtype)
    opt_state = jax.tree_util.tree_map_with_path(one, jax.device_get(state.opt_state))
    state = state_lib.TrainState(np.asarray(step, np.int32), state.params, opt_state)
    kept = "its optimizer state (experts: their dense MLP's; routers fresh)" \
        if moments else "a fresh optimizer state"
    return jax.device_put(state, setup.shardings), \
        f"continuing the dense run's schedule from step {step} with {kept}"


def straight_through_phase(setup: state_lib.Setup, origin: weights.Origin | None,
                           num_train_steps: int):
    """(the last step whose router gradient is straight-through, the set-up of the steps after
    it or None where the run's own serves them all): moe.straight_through_steps N > 0 counts N
    steps from where the run began (the upcycled step S, else 0), -1 every step, 0 none."""
    n = setup.cfg.moe.straight_through_steps if setup.cfg.moe else 0
    if n <= 0:
        return (num_train_steps if n else 0), None
    begin = 0
    if origin is not None and (origin.path / CONTINUE_FILE).is_file():
        begin = int(json.loads((origin.path / CONTINUE_FILE).read_text())["step"])
    cfg = setup.cfg.replace(moe=dataclasses.replace(setup.cfg.moe, straight_through_steps=0))
    return begin + n, dataclasses.replace(setup, cfg=cfg,
                                          graphdef=state_lib.abstract_model(cfg, setup.seed)[0])


def upcycle(dense_dir, model: str, out, seed: int = 0, resume: str = "weights",
            straight_through_steps: int = 0) -> tuple[ModelConfig, bool]:
    """Writes the upcycled checkpoint to ``out`` (a new or empty directory), through a
    temporary sibling renamed at the end; ``resume``: where the continued run starts
    (CONTINUE, module doc). Returns (its model, whether a tokenizer came with it)."""
    if resume not in CONTINUE:
        raise ValueError(f"--continue {resume}: use one of {', '.join(CONTINUE)}")
    out = pathlib.Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not an empty directory; give a new one "
                         "(nothing was written)")
    origin = weights.resolve(dense_dir)
    target = target_model(origin.cfg, model, straight_through_steps)
    if resume != "weights" and not origin.is_workdir:
        raise ValueError(f"--continue {resume} needs a switchzoo workdir as --dense (a Hugging "
                         "Face directory holds no step or optimizer state); use --continue "
                         "weights")
    # The Hugging Face format only where transformers computes the same model: never with
    # renormalised gates (module doc), so a switchzoo checkpoint.
    as_hf = hf.refusal(target) is None
    setup = state_lib.setup(origin.cfg.replace(scan_layers=False), "data_parallel", "data:1",
                            devices=_host_device())     # one copy, read back to the host
    params = upcycle_params(jax.device_get(origin.load(setup)), target, seed)
    tokenizer = weights.run_tokenizer(origin.path) if origin.is_workdir else None
    step = origin.loaded.get("step", 0)
    moments = dense_moments(origin, step) if resume == "optimizer" else None
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
        if resume != "weights":
            (tmp / CONTINUE_FILE).write_text(json.dumps({"continue": resume, "step": step}) + "\n")
        if moments is not None:
            tensorfile.write_arrays(tmp / MOMENTS_FILE,
                                    {k: np.asarray(v) for k, v in moments.items()})
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
        "its layer's dense MLP, fresh routers, gates renormalised to sum to one per token; "
        "the continued run starts at step 0, or (--continue) goes on with the dense run's "
        "schedule and optimizer state."))
    parser.error = errors.bad_flag
    parser.add_argument("--dense", required=True, help="a switchzoo workdir (its newest "
                        "checkpoint) or a Hugging Face SwitchTransformers / T5 directory")
    parser.add_argument("--model", required=True, help="the catalogue's Switch model to make "
                        "(its layers must match the dense model's; e.g. switch_cpu_8 for t5_cpu)")
    parser.add_argument("--out", required=True, help="a new directory for the checkpoint")
    parser.add_argument("--seed", type=int, default=0, help="seed of the routers' "
                        "initialisation (the model's own, as a fresh run of it with this seed)")
    parser.add_argument("--continue", dest="resume", choices=CONTINUE, default="weights",
                        help="where the continued run (train.py --config.init_from=OUT) starts: "
                        "'weights' (default): step 0, fresh optimizer; 'schedule': the dense "
                        "run's step, so its learning-rate schedule goes on, fresh optimizer "
                        "state (T5X's upcycling, the paper's language runs); 'optimizer': that "
                        "and the dense run's optimizer state, each expert's a copy of its dense "
                        "MLP's, the routers' fresh (the paper's vision runs). Needs a workdir "
                        "as --dense")
    parser.add_argument("--straight-through-steps", type=int, default=0, help="the renormalised "
                        "top-1 gate is the constant 1, so the router learns from the aux and z "
                        "losses alone (default 0, the paper's app. B.7); N trains it for the "
                        "continued run's first N steps (-1: all) with the raw probability's "
                        "gradient (straight-through). Written to model.json; the run's "
                        "--config.moe.straight_through_steps overrides it")
    parser.add_argument("--verbose", action="store_true", help="Show full tracebacks on errors.")
    args = parser.parse_args(argv)
    try:
        target, tokenizer = upcycle(args.dense, args.model, args.out, args.seed, args.resume,
                                    args.straight_through_steps)
    except (ValueError, KeyError, FileNotFoundError) as e:
        if args.verbose:
            raise
        print(f"error: {errors.one_line(e)}", file=sys.stderr)
        return 2
    sparse = weights.sparse_layers(target)
    out = pathlib.Path(args.out)
    print(f"upcycled {args.dense} into {out}: {args.model}, {target.moe.num_experts} experts in "
          f"{sum(map(len, sparse.values()))} of {target.num_encoder_layers + target.num_layers} "
          f"feed-forward layers, routers from seed {args.seed}, each token's gates summing to one")
    vocab = (f" --config.data.vocab_path={shlex.quote(str(out / tokenizer_lib.CACHE_NAME))}"
             if tokenizer else "")
    start = {"weights": "fresh optimizer, step 0", "schedule": "the dense run's step, fresh "
             "optimizer", "optimizer": "the dense run's step and optimizer"}[args.resume]
    print(f"continue training it ({start}) with the dense run's config:\n"
          f"  python train.py --config=CONFIG --config.model={args.model} "
          f"--config.init_from={shlex.quote(str(out))}{vocab} --workdir=NEW_WORKDIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
