"""The GPU levers, read in the train step lowered for CUDA on this CPU (bench/cuda_hlo.py): what
cuDNN's fused attention is given (bias [1, H, T, S], causality and right padding as its own
masks), one fused forward per layer under remat "minimal", and a Switch dispatch whose
gradient has no float scatter-add. Sizes are chosen so that no other tensor has the shape
[B, H, T, S]."""
import dataclasses
import pathlib
import sys

import pytest

from switchzoo import attention_impl
from switchzoo.config import ModelConfig, MoeConfig

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))

import cuda_hlo  # noqa: E402

B, H, T, D = 4, 3, 40, 24
DENSE = ModelConfig(vocab_size=96, d_model=D, num_heads=H, d_kv=8, d_ff=56, num_layers=2,
                    dtype="bfloat16", scan_layers=True, attention="cudnn")
SWITCH = dataclasses.replace(
    DENSE, num_encoder_layers=2, moe=MoeConfig(num_experts=4, top_k=2, group_size=T,
                                               sparse_every=1, dispatch="index"))


def facts(cfg, **fields) -> dict:
    return cuda_hlo.facts(cuda_hlo.lower(cfg, B, T, **fields), B, H, T)


def test_cudnn_gets_one_bias_per_head_and_its_own_masks():
    """Rows without segments: the bias [1, H, T, T] and a causal mask type, no [B, H, T, T]
    tensor anywhere (nor its batch reduction); evaluation's rows (lengths): cuDNN's padding
    mask. Packed rows keep the boolean mask JAX adds to the bias, as the start line says."""
    plain = facts(DENSE)
    assert plain["bias_shapes"] == [(1, H, T, T)] and plain["mask_types"] == ["CAUSAL"]
    assert plain["tensors_BHTS"] == plain["batch_reductions_BHTS"] == 0
    rows = facts(DENSE, lengths=True)
    assert rows["mask_types"] == ["PADDING_CAUSAL"] and rows["tensors_BHTS"] == 0
    packed = facts(DENSE, packed=True)
    assert packed["bias_shapes"] == [(B, H, T, T)] and packed["batch_reductions_BHTS"] == 1
    assert "packed rows (segments) reach it as a mask" in attention_impl.PACKED


@pytest.mark.parametrize("dispatch,remat", [("index", "none"), ("index", "minimal"),
                                            ("dropless", "none")])
def test_one_fused_forward_per_layer_and_no_dispatch_scatter(dispatch, remat):
    """An encoder-decoder Switch (top-2): one cuDNN forward per backward under either policy
    (minimal keeps the forward's outputs: layers.minimal_policy); cross-attention without a
    mask or bias; float scatter-adds only outside the dispatch (switchzoo.permute: the
    cross-entropy's, the embedding's and the router's top-k gates [G, N, E]): none lands in
    [tokens or slots, d_model]."""
    moe = dataclasses.replace(SWITCH.moe, dispatch=dispatch)
    got = facts(dataclasses.replace(SWITCH, remat=remat, moe=moe))
    # a scanned stack's loop body runs one layer: self (and cross) attention, once each way
    assert got["cudnn_forward"] == got["cudnn_backward"] == 3
    assert got["mask_types"] == ["CAUSAL", "NO_MASK"] and got["tensors_BHTS"] == 0
    assert got["bias_shapes"] == [(1, H, T, T)]
    onto_tokens = [s for s in got["scatter_adds"] if s["result"][-1] == D
                   and s["result"] != [DENSE.vocab_size, D]]
    assert not onto_tokens, got["scatter_adds"]
    assert got["largest_scatter_updates"] < H * T * T
