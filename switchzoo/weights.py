"""What a directory of weights names (``--config.init_from``, ``eval.py --checkpoint``, upcycling's
dense model): the model, and its parameters placed on a set-up.

A switchzoo run's workdir (checkpoints/ + model.json): the newest committed checkpoint's
parameters, without its optimizer state. Else a Hugging Face directory (switchzoo.hf); a
model.json beside its config.json (switchzoo.upcycle writes one) is the model to run, routing
and all, where the Hugging Face config can only say a fixed expert capacity — it must describe
the same tensors.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import types
import typing

import jax

from switchzoo import atomic, checkpoints, errors, hf, resume, transformer
from switchzoo import t5x  # T5X checkpoints dispatch (switchzoo.t5x)
from switchzoo import state as state_lib
from switchzoo.config import ModelConfig, MoeConfig
from switchzoo.data import tokenizer as tokenizer_lib

MODEL_FILE = "model.json"      # a run's (or an upcycled checkpoint's) resolved ModelConfig
BEST_DIR = "best"              # a fine-tune's best checkpoint by its task's score (a run of its
                               # own: checkpoints/ + model.json; switchzoo.finetune)
MODEL_FIX = ("restore it from a copy of the run, or move it away (train.py writes it again from "
             "config.json when the run resumes; eval.py then rebuilds the model from config.json)")
# The fields that decide which tensors a model has and what they compute.
ARCHITECTURE = ("vocab_size", "d_model", "num_heads", "d_kv", "d_ff", "num_encoder_layers",
                "num_layers", "activation", "relpos_buckets", "relpos_max_distance",
                "tie_embeddings")


def sparse_layers(cfg: ModelConfig) -> dict[str, list[int]]:
    """{stack: its Switch layers}."""
    def stack(n: int, encoder: bool) -> list[int]:
        return [i for i in range(n) if cfg.moe is not None and cfg.moe.is_sparse(i, encoder)]
    return {"encoder": stack(cfg.num_encoder_layers, True), "decoder": stack(cfg.num_layers, False)}


def differences(a: ModelConfig, b: ModelConfig, fields=ARCHITECTURE) -> list[tuple]:
    """(field, a's, b's) of each of ``fields`` where the two differ."""
    return [(f, getattr(a, f), getattr(b, f)) for f in fields if getattr(a, f) != getattr(b, f)]


def _fits(value, hint) -> bool:
    """Whether a JSON value can stand for a field annotated ``hint`` (of ModelConfig)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, (int, float) if hint is float else int) \
            and not isinstance(value, bool)
    if typing.get_origin(hint) is tuple:
        return isinstance(value, list) and all(_fits(v, typing.get_args(hint)[0]) for v in value)
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    return isinstance(value, hint)


def _wrong_field(cls, d: dict, prefix: str = "") -> str | None:
    """The first field of ``d`` that is missing or not of its type in dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in d:
            if dataclasses.MISSING is f.default is f.default_factory:   # required
                return f"it lacks {prefix}{f.name}"
        elif not _fits(d[f.name], hints[f.name]):
            return f"{prefix}{f.name} is {d[f.name]!r}"
        elif isinstance(d[f.name], dict):
            wrong = _wrong_field(MoeConfig, d[f.name], f"{f.name}.")
            if wrong:
                return wrong
    return None


def read_model(path: pathlib.Path) -> ModelConfig:
    """A saved ModelConfig; ValueError in one line naming the file, the fault and the fix."""
    fix = MODEL_FIX
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON (line {e.lineno}): {fix}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text: {fix}") from None
    wrong = _wrong_field(ModelConfig, d) if isinstance(d, dict) else "not a JSON object"
    try:
        if wrong is None:
            return ModelConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        wrong = errors.one_line(e)
    raise ValueError(f"{path} is not a switchzoo model config ({wrong}): {fix}")


def run_tokenizer(directory: pathlib.Path) -> pathlib.Path:
    """Where a run's SentencePiece model is: the data.vocab_path in its config.json, else the
    one it trained and cached in the workdir (the order data.tokenizer loads them in)."""
    run = pathlib.Path(directory) / "config.json"
    given = (json.loads(run.read_text()).get("data") or {}).get("vocab_path") \
        if run.is_file() else None
    return pathlib.Path(given).expanduser() if given else directory / tokenizer_lib.CACHE_NAME


def write_model(directory: pathlib.Path, cfg: ModelConfig) -> None:
    atomic.write_text(pathlib.Path(directory) / MODEL_FILE,
                      json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n")


@dataclasses.dataclass(frozen=True)
class Origin:
    """A model (``cfg``, in the form its weights are stored) and where its weights are: a
    Hugging Face directory (``hf``: hf.read_config's answer) or a workdir (``hf`` None)."""
    path: pathlib.Path
    cfg: ModelConfig
    hf: hf.Pretrained | None = None
    loaded: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def is_workdir(self) -> bool:
        return self.hf is None

    def describe(self) -> str:
        """Where the weights are, for a printed line: the Hugging Face directory, or the run
        and (once ``load`` has read it) its checkpoint's step."""
        if self.hf is not None:
            kind = "T5X checkpoint" if t5x.is_checkpoint(self.path) else "Hugging Face directory"
            return f"the {kind} {self.path}"
        step = self.loaded.get("step")
        return f"run {self.path}" + (f" (checkpoint {step})" if step is not None else "")

    def load(self, setup: state_lib.Setup):
        """The parameters in ``setup``'s shardings (its model: ``cfg`` under the run's routing
        and execution settings; scanned or not, either way)."""
        if self.hf is not None:
            return hf.load_params(self.hf, setup)[0]
        saved = state_lib.setup(self.cfg, setup.layout)
        ckpt = checkpoints.Checkpoints(self.path / "checkpoints", 1, None,
                                       read_only=True)  # the run may be training meanwhile
        try:
            step, params = resume.read_newest(
                ckpt, None, lambda s: ckpt.restore_params(s, saved.abstract, saved.shardings),
                lambda s, e: f"checkpoint {s} in {self.path / 'checkpoints'} does not hold the "
                             f"parameters of its {MODEL_FILE} ({errors.one_line(e)[:300]})")
            if step is None:
                raise FileNotFoundError(f"{self.path / 'checkpoints'} holds no complete "
                                        "checkpoint; train the run first")
        finally:
            ckpt.close()
        self.loaded["step"] = step
        if self.cfg.scan_layers == setup.cfg.scan_layers:
            return params
        return jax.jit(lambda p: transformer.layers_as(p, setup.cfg),
                       out_shardings=setup.param_shardings)(params)


def resolve(path) -> Origin:
    """The model and weights ``path`` names (a workdir or a Hugging Face directory); reads
    configs only, no weights."""
    path = pathlib.Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory; pass a switchzoo run's workdir or "
                                "a Hugging Face model directory (config.json + model.safetensors)")
    saved = path / MODEL_FILE
    if (path / "checkpoints").is_dir():
        if not saved.is_file():
            raise FileNotFoundError(f"{path} holds checkpoints/ but no {MODEL_FILE} (a run "
                                    "from before switchzoo saved its model); pass a run trained "
                                    "since, or a Hugging Face directory")
        return Origin(path, read_model(saved))
    pretrained = t5x.read_any(path)     # a Hugging Face directory or a T5X checkpoint
    if saved.is_file():
        cfg = read_model(saved)
        wrong = differences(cfg, pretrained.cfg)
        if sparse_layers(cfg) != sparse_layers(pretrained.cfg):
            wrong.append(("Switch layers", sparse_layers(cfg), sparse_layers(pretrained.cfg)))
        if cfg.moe and pretrained.cfg.moe and cfg.moe.num_experts != pretrained.cfg.moe.num_experts:
            wrong.append(("experts", cfg.moe.num_experts, pretrained.cfg.moe.num_experts))
        if wrong:
            field, mine, theirs = wrong[0]
            raise hf.CheckpointError(f"{saved} says {field} {mine} but {path / 'config.json'} "
                                     f"and the weights say {theirs}; they describe different "
                                     f"models: remove the stale {MODEL_FILE}")
        pretrained = dataclasses.replace(pretrained, cfg=cfg)
    return Origin(path, pretrained.cfg, pretrained)
