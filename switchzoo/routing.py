"""Tokens-choose top-k routing (Switch k=1, GShard k=2) within groups, in float32.

Shapes: G routing groups, N tokens per group, E experts, P experts picked per token (top-k),
C slots per expert.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from switchzoo.layers import param


class Routing(NamedTuple):
    dispatch_GNEC: jax.Array      # 1 where token n goes to slot c of expert e
    combine_GNEC: jax.Array       # its gate (0 for dropped tokens)
    aux_loss: jax.Array           # Switch eq. 4 (alpha = 1): 1.0 at perfect balance
    z_loss: jax.Array             # mean squared log-partition of the router logits
    metrics: dict                 # dropped_fraction, expert_load [E], router_confidence


class Router(nnx.Module):
    """Linear router computed in float32 whatever the activation dtype (selective precision)."""

    def __init__(self, d_model: int, num_experts: int, rngs: nnx.Rngs):
        self.w = param(rngs, (0.1 / d_model) ** 0.5, (d_model, num_experts), ("d_model", "experts"))

    def __call__(self, x_GND, jitter: float = 0.0, rng=None):
        x = x_GND.astype(jnp.float32)
        if rng is not None and jitter > 0:
            x = x * jax.random.uniform(rng, x.shape, jnp.float32, 1.0 - jitter, 1.0 + jitter)
        return jnp.einsum("GND,DE->GNE", x, self.w[...])


def _top_k(probs_GNE, k: int):
    """Top-k by repeated argmax: partitions along groups, where lax.top_k gets all-gathered."""
    gates, indices = [], []
    for _ in range(k):
        index_GN = jnp.argmax(probs_GNE, axis=-1)
        gates.append(jnp.take_along_axis(probs_GNE, index_GN[..., None], axis=-1)[..., 0])
        indices.append(index_GN)
        probs_GNE = jnp.where(jax.nn.one_hot(index_GN, probs_GNE.shape[-1], dtype=bool),
                              -1.0, probs_GNE)
    return jnp.stack(gates, -1), jnp.stack(indices, -1).astype(jnp.int32)


class Choices(NamedTuple):
    gates_GNP: jax.Array          # gate of each pick (renormalised over picks if asked)
    index_GNP: jax.Array          # expert of each pick, int32
    mask_GNPE: jax.Array          # one-hot picks, zero for padding
    aux_loss: jax.Array
    z_loss: jax.Array
    metrics: dict                 # expert_load [E], router_confidence


def choose(logits_GNE, top_k: int, normalize: bool = True, valid_GN=None) -> Choices:
    """Each token's top-k experts and gates, and the routing losses (no capacity yet).
    Tokens with ``valid_GN`` false (padding) pick nothing and count in no loss or metric."""
    logits_GNE = logits_GNE.astype(jnp.float32)
    G, N, E = logits_GNE.shape
    valid_GN = (jnp.ones((G, N), jnp.float32) if valid_GN is None
                else valid_GN.astype(jnp.float32))
    count = jnp.maximum(jnp.sum(valid_GN), 1.0)
    probs_GNE = jax.nn.softmax(logits_GNE, axis=-1)
    gates_GNP, index_GNP = _top_k(probs_GNE, top_k)
    if normalize and top_k > 1:
        gates_GNP = gates_GNP / jnp.sum(gates_GNP, axis=-1, keepdims=True)
    mask_GNPE = jax.nn.one_hot(index_GNP, E, dtype=jnp.float32) * valid_GN[:, :, None, None]

    # Switch eq. 4 over first choices (as GShard), so it is 1.0 at perfect balance for any k:
    # E * sum_e f_e * P_e, f_e = fraction of tokens whose first choice is e, P_e = mean prob.
    tokens_G = jnp.maximum(jnp.sum(valid_GN, axis=1), 1.0)          # routed tokens per group
    fraction_GE = jnp.sum(mask_GNPE[:, :, 0], axis=1) / tokens_G[:, None]
    prob_GE = jnp.sum(probs_GNE * valid_GN[..., None], axis=1) / tokens_G[:, None]
    aux_loss = jnp.sum(fraction_GE * prob_GE) / jnp.maximum(jnp.sum(jnp.any(valid_GN > 0, 1)),
                                                            1.0) * E
    z_loss = jnp.sum(jnp.square(jax.nn.logsumexp(logits_GNE, axis=-1)) * valid_GN) / count
    metrics = {
        "expert_load": jnp.sum(mask_GNPE, axis=(0, 1, 2)) / (count * top_k),
        "router_confidence": jnp.sum(jnp.max(probs_GNE, axis=-1) * valid_GN) / count,
    }
    return Choices(gates_GNP, index_GNP, mask_GNPE, aux_loss, z_loss, metrics)


def route(logits_GNE, top_k: int, capacity: int, normalize: bool = True,
          valid_GN=None) -> Routing:
    """Picks each token's top-k experts and gives it a slot while the expert has room.

    Priority is by choice, then position: every token's first choice is served (in position
    order) before any second choice, as in GShard. Tokens past capacity are dropped: they get no
    slot, the layer outputs zero for them and the residual connection carries them. Tokens with
    ``valid_GN`` false (padding) are not routed and count in no loss or metric.

    With top_k > 1 this priority is not causal: a later token's first choice can take the slot
    of an earlier token's second choice (as in GShard); top-1 routing is causal.
    """
    c = choose(logits_GNE, top_k, normalize, valid_GN)
    G, N, E = logits_GNE.shape
    mask_GNPE = c.mask_GNPE

    # Slot = how many earlier (choice, position) pairs chose the same expert.
    flat_mask = jnp.swapaxes(mask_GNPE, 1, 2).reshape(G, top_k * N, E)      # [G, P*N, E]
    flat_slot = jnp.cumsum(flat_mask, axis=1) - 1.0
    slot_GNPE = jnp.swapaxes(flat_slot.reshape(G, top_k, N, E), 1, 2)
    keep_GNPE = mask_GNPE * (slot_GNPE < capacity)
    slot_GNP = jnp.sum(slot_GNPE * mask_GNPE, axis=-1).astype(jnp.int32)
    onehot_GNPC = jax.nn.one_hot(slot_GNP, capacity, dtype=jnp.float32)
    dispatch_GNEC = jnp.einsum("GNPE,GNPC->GNEC", keep_GNPE, onehot_GNPC)
    combine_GNEC = jnp.einsum("GNP,GNPE,GNPC->GNEC", c.gates_GNP, keep_GNPE, onehot_GNPC)
    metrics = {
        # per (token, pick) assignment: with top-2, a token may lose one pick and keep the other
        "dropped_fraction": 1.0 - jnp.sum(keep_GNPE) / jnp.maximum(jnp.sum(mask_GNPE), 1.0),
        **c.metrics,
    }
    return Routing(dispatch_GNEC, combine_GNEC, c.aux_loss, c.z_loss, metrics)
