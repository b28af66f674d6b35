"""Routing within groups, in float32: tokens-choose top-k (Switch k=1, GShard k=2; optionally
with DeepSeek-V3's balancing bias) and experts-choose (Zhou et al. 2022).

Shapes: G routing groups, N tokens per group, E experts, P experts picked per token (top-k),
C slots per expert.

A routing is indices (``Routing``): which token fills each expert slot and with what combine
weight, and for tokens-choose each pick's expert and slot. The one-hot [G, N, E, C] masks the
einsum dispatch multiplies by are built from them on demand (``Routing.dispatch_GNEC``).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from switchzoo.layers import Init


class Balance(NamedTuple):
    """Switch eq. 4's parts as sums over each routing group's valid tokens, which add over
    layers (MoeConfig.loss_reduction="pooled": one eq. 4 per stack, pooled_aux_loss)."""
    tokens_G: jax.Array           # valid tokens
    chosen_GE: jax.Array          # of them, those whose first choice is e (before capacity)
    prob_GE: jax.Array            # their router probabilities for e, summed


def switch_aux_loss(b: Balance) -> jax.Array:
    """Switch eq. 4 (alpha = 1; 1.0 at perfect balance): E * sum_e f_e * P_e in each group with
    tokens (f_e: the fraction of its tokens whose first choice is e; P_e: their mean probability
    for e), averaged over those groups."""
    E = b.chosen_GE.shape[-1]
    tokens_G = jnp.maximum(b.tokens_G, 1.0)
    fraction_GE = b.chosen_GE / tokens_G[:, None]
    prob_GE = b.prob_GE / tokens_G[:, None]
    return jnp.sum(fraction_GE * prob_GE) / jnp.maximum(jnp.sum(b.tokens_G > 0), 1.0) * E


def pooled_aux_loss(b_L: Balance) -> jax.Array:
    """One Switch eq. 4 over layers pooled ([layers, G, ...] sums; each group the same tokens in
    every layer, as in one stack): f_e and P_e are means over the group's tokens of all the
    layers, as transformers' load_balancing_loss_func over the router logits of a stack's
    Switch layers concatenated per sequence (a group is a sequence where moe.group_size is 0)."""
    return switch_aux_loss(Balance(*(jnp.sum(x, axis=0) for x in b_L)))


class Routing(NamedTuple):
    token_GEC: jax.Array          # int32: the token in slot c of expert e; N where it is empty
    weight_GEC: jax.Array         # that token's combine weight (its gate; 0 where empty)
    served_GN: jax.Array          # int32: how many experts serve token n (0: dropped, padding)
    aux_loss: jax.Array           # Switch eq. 4 (alpha = 1): 1.0 at perfect balance
    z_loss: jax.Array             # mean squared log-partition of the router logits
    # dropped_fraction, expert_load [E], router_confidence: means over this call's valid
    # tokens (0 where it has none); routed_tokens: how many, the weight to average calls by.
    metrics: dict
    # Tokens-choose only (None for experts-choose): each pick's expert and slot (int32),
    # whether it kept that slot, and its combine weight (0 unless kept).
    expert_GNP: jax.Array | None = None
    slot_GNP: jax.Array | None = None
    kept_GNP: jax.Array | None = None
    gate_GNP: jax.Array | None = None
    balance: Balance | None = None   # eq. 4's sums (zero for experts-choose: no aux loss)
    pick_GEC: jax.Array | None = None  # tokens-choose: the pick (n * P + p) in each slot

    @property
    def dispatch_GNEC(self):
        """1 where token n goes to slot c of expert e (float32; what the einsum dispatch
        multiplies by, built here from ``token_GEC``: an empty slot's index N is no token)."""
        onehot_GECN = jax.nn.one_hot(self.token_GEC, self.served_GN.shape[1], dtype=jnp.float32)
        return jnp.transpose(onehot_GECN, (0, 3, 1, 2))

    @property
    def combine_GNEC(self):
        """The dispatch mask times each token's combine weight (0 for dropped tokens)."""
        return self.dispatch_GNEC * self.weight_GEC[:, None]


def _fill_slots(cell_GNP, capacity: int, num_experts: int):
    """The pick (n * P + p) in each slot, from each pick's flat slot e * C + c (E * C: none):
    [G, E, C], N * P where a slot is empty. Kept picks have distinct slots and the others'
    index is past the end (dropped), so this integer scatter has no collisions. Batched over
    the groups (vmap), which stay on their devices."""
    G, N, P = cell_GNP.shape

    def one_group(cell_Q):
        empty = jnp.full((num_experts * capacity,), N * P, jnp.int32)
        return empty.at[cell_Q].set(jnp.arange(N * P, dtype=jnp.int32), mode="drop")
    return jax.vmap(one_group)(cell_GNP.reshape(G, N * P)).reshape(G, num_experts, capacity)


def _take_rows(table_GQ, index_GK):
    """table[g, index[g, k]] (0 where the index is past the table's end), batched over G."""
    return jax.vmap(lambda t, i: t.at[i].get(mode="fill", fill_value=0))(table_GQ, index_GK)


class Router(nnx.Module):
    """Linear router computed in float32 whatever the activation dtype (selective precision).
    With ``bias`` (moe.balance='bias'), a per-expert balancing bias [E] that shifts the choice
    only (``choose``); a parameter so that it is checkpointed, stepped by optim.per_layer.
    Its weight starts as every weight matrix of the model does (``init``)."""

    def __init__(self, d_model: int, num_experts: int, rngs: nnx.Rngs, bias: bool = False,
                 init: Init = Init(0.1, True)):
        self.w = init.matrix(rngs, d_model, (d_model, num_experts), ("d_model", "experts"))
        self.bias = (nnx.Param(jnp.zeros((num_experts,), jnp.float32), dims=("experts",))
                     if bias else None)

    def __call__(self, x_GND, jitter: float = 0.0, rng=None):
        x = x_GND.astype(jnp.float32)
        if rng is not None and jitter > 0:
            x = x * jitter_noise(rng, x.shape, jitter)
        # HIGHEST: the same routing on every backend (GPU would otherwise round to TF32).
        return jnp.einsum("GND,DE->GNE", x, self.w[...], precision=jax.lax.Precision.HIGHEST)


def jitter_noise(rng, shape, jitter: float):
    """Multiplicative noise uniform over 256 evenly spaced values in [1 - jitter, 1 + jitter]
    (Mesh-TensorFlow's switch_jitter draws it in float32). One random byte per element: the
    float32 draw (four bytes each) was the largest cost a Switch layer added to the CPU LM
    study's step (5% of it); a noise of +-1% needs no finer steps than 2 x jitter / 255."""
    u8 = jax.random.bits(rng, shape, jnp.uint8).astype(jnp.float32)
    return (1.0 - jitter) + u8 * (2.0 * jitter / 255.0)


def _top_k(probs_GNE, k: int, scores_GNE):
    """The k experts of highest score, with their probabilities as gates. By repeated argmax:
    partitions along groups, where lax.top_k gets all-gathered."""
    gates, indices = [], []
    for _ in range(k):
        index_GN = jnp.argmax(scores_GNE, axis=-1)
        gates.append(jnp.take_along_axis(probs_GNE, index_GN[..., None], axis=-1)[..., 0])
        indices.append(index_GN)
        scores_GNE = jnp.where(jax.nn.one_hot(index_GN, scores_GNE.shape[-1], dtype=bool),
                               -jnp.inf, scores_GNE)
    return jnp.stack(gates, -1), jnp.stack(indices, -1).astype(jnp.int32)


def _sum_to_one(gates_GNP, kept_GNP, straight_through: bool = False):
    """Each token's gates over its kept picks, renormalised to sum to one (zero where none is
    kept; moe.gates_sum_to_one), differentiated as that value (the renormalised gate of a token
    with one expert is the constant 1: the router learns from the aux and z losses alone, the
    "vanishing routing gradient" Komatsuzaki et al. 2022, app. B.7, note and accept), or with
    ``straight_through`` as the raw ``gates_GNP`` (moe.straight_through_steps)."""
    kept_GNP = gates_GNP * kept_GNP
    total_GN1 = jnp.sum(kept_GNP, axis=-1, keepdims=True)
    value_GNP = kept_GNP / jnp.where(total_GN1 > 0, total_GN1, 1.0)
    if not straight_through:
        return value_GNP
    return jax.lax.stop_gradient(value_GNP) + (gates_GNP - jax.lax.stop_gradient(gates_GNP))


def _z_loss_and_confidence(logits_GNE, probs_GNE, valid_GN, count):
    """Mean squared log-partition, and how far routing has left uniform, over the valid
    tokens: router_confidence (mean top probability; 1/E uniform), router_entropy (mean, in
    nats; log E uniform) and router_logit_std (std of a token's logits over the experts)."""
    z_loss = jnp.sum(jnp.square(jax.nn.logsumexp(logits_GNE, axis=-1)) * valid_GN) / count
    entropy_GN = -jnp.sum(probs_GNE * jax.nn.log_softmax(logits_GNE, axis=-1), axis=-1)
    return z_loss, {
        "router_confidence": jnp.sum(jnp.max(probs_GNE, axis=-1) * valid_GN) / count,
        "router_entropy": jnp.sum(entropy_GN * valid_GN) / count,
        "router_logit_std": jnp.sum(jnp.std(logits_GNE, axis=-1) * valid_GN) / count}


class Choices(NamedTuple):
    gates_GNP: jax.Array          # gate of each pick (renormalised over picks if asked)
    index_GNP: jax.Array          # expert of each pick, int32
    mask_GNPE: jax.Array          # one-hot picks, zero for padding
    aux_loss: jax.Array
    z_loss: jax.Array
    metrics: dict                 # expert_load [E], router_confidence, routed_tokens
                                  # (and bias_balance)
    balance: Balance              # aux_loss's sums


def choose(logits_GNE, top_k: int, normalize: bool = True, valid_GN=None,
           bias_E=None, sum_to_one: bool = False, straight_through: bool = False) -> Choices:
    """Each token's top-k experts and gates, and the routing losses (no capacity yet).
    Tokens with ``valid_GN`` false (padding) pick nothing and count in no loss or metric.

    ``bias_E`` (DeepSeek-V3's auxiliary-loss-free balancing) is added to the probabilities for
    the choice only; the gates stay the unbiased probabilities. Its update, bias += rate *
    sign(1/E - load), runs as a gradient step: ``metrics["bias_balance"]`` is sum_e bias_e *
    (load_e - 1/E) with the load held constant, which steps.lm_objective adds to the loss
    and subtracts back out (the value is unchanged, the gradient by bias_e is load_e - 1/E,
    summed over micro-batches into the whole batch's), and optim.per_layer steps the bias by
    rate x the sign of that gradient. Nothing else reaches the
    bias: the choice is an argmax. No bookkeeping of layers, so scanned layers, gradient
    accumulation and any sharding just work."""
    logits_GNE = logits_GNE.astype(jnp.float32)
    G, N, E = logits_GNE.shape
    valid_GN = (jnp.ones((G, N), jnp.float32) if valid_GN is None
                else valid_GN.astype(jnp.float32))
    count = jnp.maximum(jnp.sum(valid_GN), 1.0)
    probs_GNE = jax.nn.softmax(logits_GNE, axis=-1)
    scores_GNE = probs_GNE if bias_E is None else probs_GNE + bias_E
    gates_GNP, index_GNP = _top_k(probs_GNE, top_k, scores_GNE)
    if sum_to_one:                       # every pick is kept here (dropless serves them all)
        gates_GNP = _sum_to_one(gates_GNP, valid_GN[..., None], straight_through)
    elif normalize and top_k > 1:
        gates_GNP = gates_GNP / jnp.sum(gates_GNP, axis=-1, keepdims=True)
    mask_GNPE = jax.nn.one_hot(index_GNP, E, dtype=jnp.float32) * valid_GN[:, :, None, None]

    # Switch eq. 4 over first choices (as GShard), so it is 1.0 at perfect balance for any k:
    # E * sum_e f_e * P_e, f_e = fraction of tokens whose first choice is e, P_e = mean prob.
    balance = Balance(jnp.sum(valid_GN, axis=1), jnp.sum(mask_GNPE[:, :, 0], axis=1),
                      jnp.sum(probs_GNE * valid_GN[..., None], axis=1))
    aux_loss = switch_aux_loss(balance)
    z_loss, diagnostics = _z_loss_and_confidence(logits_GNE, probs_GNE, valid_GN, count)
    load_E = jnp.sum(mask_GNPE, axis=(0, 1, 2)) / (count * top_k)     # before capacity
    metrics = {"expert_load": load_E, **diagnostics, "routed_tokens": jnp.sum(valid_GN)}
    if bias_E is not None:
        metrics["bias_balance"] = jnp.sum(
            bias_E * jax.lax.stop_gradient(load_E - 1.0 / E))
    return Choices(gates_GNP, index_GNP, mask_GNPE, aux_loss, z_loss, metrics, balance)


def route(logits_GNE, top_k: int, capacity: int, normalize: bool = True,
          valid_GN=None, bias_E=None, sum_to_one: bool = False,
          straight_through: bool = False) -> Routing:
    """Picks each token's top-k experts and gives it a slot while the expert has room.

    Priority is by choice, then position: every token's first choice is served (in position
    order) before any second choice, as in GShard. Tokens past capacity are dropped: they get no
    slot, the layer outputs zero for them and the residual connection carries them. Tokens with
    ``valid_GN`` false (padding) are not routed and count in no loss or metric.

    With top_k > 1 this priority is not causal: a later token's first choice can take the slot
    of an earlier token's second choice (as in GShard); top-1 routing is causal. ``bias_E``:
    see ``choose``.
    """
    c = choose(logits_GNE, top_k, normalize and not sum_to_one, valid_GN, bias_E)
    G, N, E = logits_GNE.shape
    mask_GNPE = c.mask_GNPE

    # Slot = how many earlier (choice, position) pairs chose the same expert.
    flat_mask = jnp.swapaxes(mask_GNPE, 1, 2).reshape(G, top_k * N, E)      # [G, P*N, E]
    flat_slot = jnp.cumsum(flat_mask, axis=1) - 1.0
    slot_GNPE = jnp.swapaxes(flat_slot.reshape(G, top_k, N, E), 1, 2)
    keep_GNPE = mask_GNPE * (slot_GNPE < capacity)
    slot_GNP = jnp.sum(slot_GNPE * mask_GNPE, axis=-1).astype(jnp.int32)
    kept_f_GNP = jnp.sum(keep_GNPE, -1)
    kept_GNP = kept_f_GNP > 0
    # sum_to_one: over the picks that kept a slot (B.7's "after routing": a top-2 token that
    # lost one pick gets gate 1 on the other, where normalize_top_k's are set before capacity)
    gates_GNP = (_sum_to_one(c.gates_GNP, kept_f_GNP, straight_through) if sum_to_one
                 else c.gates_GNP)
    gate_GNP = gates_GNP * kept_f_GNP
    cell_GNP = jnp.where(kept_GNP, c.index_GNP * capacity + slot_GNP, E * capacity)
    pick_GEC = _fill_slots(cell_GNP, capacity, E)
    token_GEC = jnp.where(pick_GEC < N * top_k, pick_GEC // top_k, N)
    weight_GEC = _take_rows(gate_GNP.reshape(G, N * top_k), pick_GEC.reshape(G, -1))
    metrics = {
        # per (token, pick) assignment: with top-2, a token may lose one pick and keep the
        # other. Counted as drops over picks, so a batch of padding drops nothing (not all).
        "dropped_fraction": (jnp.sum(mask_GNPE) - jnp.sum(keep_GNPE))
                            / jnp.maximum(jnp.sum(mask_GNPE), 1.0),
        **c.metrics,
    }
    return Routing(token_GEC, weight_GEC.reshape(G, E, capacity),
                   jnp.sum(kept_GNP, -1, dtype=jnp.int32), c.aux_loss, c.z_loss, metrics,
                   c.index_GNP, slot_GNP, kept_GNP, gate_GNP, c.balance, pick_GEC)


def experts_choose_route(logits_GNE, capacity: int, valid_GN=None) -> Routing:
    """Each expert takes the ``capacity`` tokens of a group with the highest router probability
    for it (Zhou et al. 2022; flaxformer's ExpertsChooseMaskedRouter), each weighted by that
    probability. Every expert is full, so the load is balanced by construction and there is no
    aux loss (zero); a token gets 0..E experts, and ``dropped_fraction`` counts the valid tokens
    no expert took. Padding (``valid_GN`` false) ranks below every real token, so it is taken
    only where a group has fewer than ``capacity`` real tokens, and then masked out.

    Not causal: whether a token is taken depends on every other token of its group. Needs
    capacity <= N (lax.top_k over the tokens of a group; groups stay on their devices).
    """
    logits_GNE = logits_GNE.astype(jnp.float32)
    G, N, E = logits_GNE.shape
    valid_GN = jnp.ones((G, N), bool) if valid_GN is None else valid_GN.astype(bool)
    valid_f_GN = valid_GN.astype(jnp.float32)
    count = jnp.maximum(jnp.sum(valid_f_GN), 1.0)
    probs_GNE = jax.nn.softmax(logits_GNE, axis=-1)
    scores_GEN = jnp.where(valid_GN[:, None, :], jnp.swapaxes(probs_GNE, 1, 2), -1.0)
    _, index_GEC = jax.lax.top_k(scores_GEN, capacity)
    index_GEC = index_GEC.astype(jnp.int32)
    token_GEC = jnp.where(_take_rows(valid_GN, index_GEC.reshape(G, -1)).reshape(G, E, capacity),
                          index_GEC, N)                         # padding taken: an empty slot
    # each slot's weight: its token's probability for the slot's expert (0 for an empty slot)
    weight_GEC = jnp.take_along_axis(jnp.swapaxes(probs_GNE, 1, 2), token_GEC, axis=-1,
                                     mode="fill", fill_value=0)
    served_GN = jax.vmap(lambda t: jnp.zeros((N,), jnp.int32).at[t].add(1, mode="drop"))(
        token_GEC.reshape(G, -1))
    filled_GEC = (token_GEC < N).astype(jnp.float32)

    z_loss, diagnostics = _z_loss_and_confidence(logits_GNE, probs_GNE, valid_f_GN, count)
    metrics = {
        "dropped_fraction": jnp.sum((served_GN == 0) * valid_f_GN) / count,   # 0 with no token
        "expert_load": (jnp.sum(filled_GEC, axis=(0, 2))
                        / jnp.maximum(jnp.sum(filled_GEC), 1.0)),
        **diagnostics,
        "routed_tokens": jnp.sum(valid_f_GN),
    }
    zeros_GE = jnp.zeros((G, E), jnp.float32)
    return Routing(token_GEC, weight_GEC, served_GN, jnp.zeros((), jnp.float32), z_loss,
                   metrics, balance=Balance(jnp.sum(valid_f_GN, axis=1), zeros_GE, zeros_GE))
