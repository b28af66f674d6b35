"""The user-facing model: load, call for logits, generate, save back.

    model = switchzoo.from_pretrained(hf_dir, mesh=None, layout=None)
    logits = model(input_ids, attention_mask=mask, decoder_input_ids=dec)   # [B, T, V]
    ids = model.generate(input_ids, attention_mask=mask, max_new_tokens=32)
    model.save_pretrained(out_dir)
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from switchzoo import hf, weights
from switchzoo import t5x  # T5X checkpoints dispatch (switchzoo.t5x)
from switchzoo import layout as layout_lib
from switchzoo import state as state_lib
from switchzoo.config import ModelConfig


class Model:
    """Config + sharded parameters + the layout they live on."""

    def __init__(self, cfg: ModelConfig, graphdef, params, layout: layout_lib.Layout,
                 hf_config: dict | None = None, facts: dict | None = None,
                 tokenizer: dict[str, bytes] | None = None):
        self.cfg, self.graphdef, self.params, self.layout = cfg, graphdef, params, layout
        self.hf_config, self.facts = hf_config, facts
        self.tokenizer = tokenizer or {}     # the tokenizer files it was loaded with

    @property
    def is_encoder_decoder(self) -> bool:
        return self.cfg.is_encoder_decoder

    def module(self):
        """The Flax NNX module holding these parameters."""
        return nnx.merge(self.graphdef, self.params)

    @functools.cached_property
    def _forward(self):
        def forward(params, src, src_seg, tgt, tgt_seg):
            model = nnx.merge(self.graphdef, params)
            with layout_lib.use(self.layout):
                if tgt is None:
                    return model(src, segments_BL=src_seg)[0]
                return model(src, tgt, src_segments=src_seg, tgt_segments=tgt_seg)[0]
        return jax.jit(forward)

    def __call__(self, input_ids, attention_mask=None, decoder_input_ids=None,
                 decoder_attention_mask=None):
        """Float32 logits [B, T, V] (evaluation mode), like transformers' forward."""
        src = jnp.asarray(input_ids, jnp.int32)
        src_seg = (jnp.ones_like(src) if attention_mask is None
                   else jnp.asarray(attention_mask, jnp.int32))
        if self.is_encoder_decoder:
            if decoder_input_ids is None:
                raise ValueError("an encoder-decoder needs decoder_input_ids (the targets shifted "
                                 "right, starting with the pad id 0)")
            tgt = jnp.asarray(decoder_input_ids, jnp.int32)
            tgt_seg = (jnp.ones_like(tgt) if decoder_attention_mask is None
                       else jnp.asarray(decoder_attention_mask, jnp.int32))
            return self._forward(self.params, src, src_seg, tgt, tgt_seg)
        if decoder_input_ids is not None:
            raise ValueError("a decoder-only model takes input_ids only")
        return self._forward(self.params, src, src_seg, None, None)

    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 32,
                 num_beams: int = 1, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int = 0, length_penalty: float = 0.6, eos_token_id: int = 1,
                 seed: int = 0) -> np.ndarray:
        """Generated ids, as transformers returns them: an encoder-decoder's start token 0 then
        the new tokens; a decoder-only model's prompt then the new tokens (0 after EOS)."""
        src = jnp.asarray(input_ids, jnp.int32)
        seg = (jnp.ones_like(src) if attention_mask is None
               else jnp.asarray(attention_mask, jnp.int32))
        new = self.new_tokens(src, seg, max_new_tokens, num_beams, do_sample, temperature,
                              top_k, length_penalty, eos_token_id, seed)
        prefix = np.zeros((src.shape[0], 1), np.int32) if self.is_encoder_decoder else src
        return np.concatenate([np.asarray(prefix), as_numpy(new)], axis=1)

    def new_tokens(self, src_BS, seg_BS, max_new_tokens: int = 32, num_beams: int = 1,
                   do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
                   length_penalty: float = 0.6, eos_token_id: int = 1, seed: int = 0):
        """``generate``'s new tokens [B, max_new_tokens] as a jax.Array, left where the mesh
        computed them: inputs may be global arrays of a multi-process run."""
        from switchzoo import decoding
        with layout_lib.use(self.layout):
            if num_beams > 1:
                return decoding.beam_search(self.graphdef, self.params, src_BS, seg_BS,
                                            max_new=max_new_tokens, beams=num_beams,
                                            alpha=length_penalty, eos_id=eos_token_id)[0]
            return decoding.sample(self.graphdef, self.params, src_BS, seg_BS,
                                   jax.random.key(seed), max_new=max_new_tokens,
                                   greedy=not do_sample, temperature=temperature,
                                   top_k=top_k, eos_id=eos_token_id)

    def save_pretrained(self, path, expert_capacity: int | None = None) -> None:
        """Writes the Hugging Face SwitchTransformers format (config.json + model.safetensors;
        T5 for a dense model), refusing in one line a model transformers would compute otherwise
        (hf.refusal: renormalised gates, top-2, experts-choose, gated experts, ...), and the
        tokenizer files of the directory it was loaded from (spiece.model,
        tokenizer.json, ...: hf.TOKENIZER_FILES), so AutoTokenizer reads the copy too. A model
        of ``init`` has no tokenizer.

        ``expert_capacity``: export a model routed by capacity factors (a catalogue model, a
        run) with that many slots per expert per sequence, as transformers routes; the
        exported model is that routing (``from_pretrained`` of the copy computes what
        transformers does). A model whose capacity is already fixed needs none."""
        cfg = self.cfg
        if expert_capacity is not None:
            if cfg.moe is None or expert_capacity < 1:
                raise ValueError(f"expert_capacity={expert_capacity}: a Switch model's slots "
                                 "per expert per sequence, >= 1 (a dense model has none)")
            cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, expert_capacity=expert_capacity,
                                                      group_size=0, eval_groups="sequence"))
        hf.save(path, cfg, self.params, self.hf_config, self.facts, self.tokenizer)


def init(model: str | ModelConfig, seed: int = 0, mesh=None, layout=None) -> Model:
    """A freshly initialised model (a catalogue name or a ModelConfig), born sharded on
    ``mesh`` under ``layout`` (default: every local device holds the whole model)."""
    setup = state_lib.setup(model, layout, mesh, seed=seed)
    return Model(setup.cfg, setup.graphdef, setup.init(), setup.layout)


def from_pretrained(path, mesh=None, layout=None) -> Model:
    """Loads a Hugging Face SwitchTransformers directory onto ``mesh`` under ``layout``. Its
    routing losses take transformers' convention (moe.loss_reduction="pooled", switchzoo.hf's
    module doc): the config's router coefficients weigh, per stack, one auxiliary loss of its
    Switch layers' routing pooled and their mean z-loss, not switchzoo's sum over layers.

    A switchzoo run's workdir loads too: a fine-tune's best checkpoint (workdir/best/) where
    it has one, else its newest; its tokenizer travels as spiece.model (save_pretrained
    writes it beside the weights)."""
    path = pathlib.Path(path).expanduser()
    if (path / "checkpoints").is_dir() or (path / weights.BEST_DIR / "checkpoints").is_dir():
        return _from_run(path, mesh, layout)
    pretrained = t5x.read_any(path)     # a Hugging Face directory or a T5X checkpoint
    setup = state_lib.setup(pretrained.cfg, layout, mesh)
    params, facts = hf.load_params(pretrained, setup)
    return Model(setup.cfg, setup.graphdef, params, setup.layout, pretrained.hf_config, facts,
                 hf.read_tokenizer(path))


def _from_run(path: pathlib.Path, mesh, layout) -> Model:
    best = path / weights.BEST_DIR
    origin = weights.resolve(best if (best / "checkpoints").is_dir() else path)
    setup = state_lib.setup(origin.cfg, layout, mesh)
    vocab = weights.run_tokenizer(path)
    return Model(setup.cfg, setup.graphdef, origin.load(setup), setup.layout,
                 tokenizer={"spiece.model": vocab.read_bytes()} if vocab.is_file() else None)


def as_numpy(x) -> np.ndarray:
    return np.asarray(jax.device_get(x))
