"""The Switch feed-forward layer: route tokens within groups, dispatch them into the experts'
capacity slots, run each expert's MLP (layers.mlp, the dense block's), combine. Dispatch
(moe.dispatch): "index" gathers each slot's token and combines by gathering each token's slots
(scatter-adding for experts-choose, where a token has 0..E of them); "einsum" multiplies by
one-hot [G, N, E, C] masks (2 N C E D flops a group each way, where index moves the E C D
values), the oracle; "dropless" (switchzoo/dropless.py) has no capacity. With the experts dim
laid out over a mesh axis, dispatch and combine compile to all-to-all (tokens move; expert
weights stay put)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from switchzoo import dropless, grouped, permute
from switchzoo.config import MoeConfig
from switchzoo.layers import Init, Mlp, dropout, ffn_params, ffn_weights, mlp, split
from switchzoo.layout import LayoutError, active, constrain
from switchzoo.routing import (Balance, Router, choose, experts_choose_route, pooled_aux_loss,
                               route)

# The stats under which each Switch layer returns routing.Balance's fields (loss_reduction
# "pooled"); the model's loss reduction (transformer: moe.combine_losses) takes them out of the metrics.
BALANCE_STATS = ("balance_tokens", "balance_chosen", "balance_prob")
# Kept-only experts (SwitchFFN._kept_or_slots): the cost of running one more expert (its
# weights' copy, its loop) counted in rows, when choosing them over slots.
KEPT_EXPERT_ROWS = 32
# Whether the experts may run on the kept picks only: None, on a CPU (where it was measured:
# docs/benchmarks.md, "Against transformers"); bench/cuda_hlo.py sets False to trace as a GPU.
KEPT_ONLY: bool | None = None


def _per_expert(x, w):
    """Each expert's slots through its weight: x [E, G, C, in], w [E, in, out]."""
    return jax.lax.dot_general(x, w.astype(x.dtype), (((3,), (1,)), ((0,), (0,))))


def num_groups(batch: int, length: int, group_size: int, shards: int = 1) -> int:
    """Groups of at most ``group_size`` tokens (0: each sequence is a group), as flaxformer's
    max_group_size: the fewest that split the batch's tokens evenly and that the layout can
    split evenly over its ``shards`` of the groups dimension (so each device routes its own
    tokens and dispatch is an all-to-all); where no such count exists, the fewest even split.
    Span corruption's 114-token targets rarely give a power of two. On a mesh whose shards
    exceed the groups one device would form (a batch smaller than shards x group_size), the
    groups are smaller than on one device, so routing there matches one device's only when
    its group count is already a multiple of the shards."""
    if group_size == 0:
        return batch
    num_tokens = batch * length
    least = -(-num_tokens // group_size)
    first = None
    for g in range(least, num_tokens + 1):
        if num_tokens % g == 0:
            if g % shards == 0:
                first = g
                break
            first = first or g
    best = min(group_size, max(num_tokens // shards, 1))     # the group size one would want
    if num_tokens // first < best / 4:
        raise LayoutError(f"MoE routing: {num_tokens} tokens per batch split evenly only into "
                          f"groups of {num_tokens // first} (moe.group_size {group_size}), too "
                          "small for capacity to mean anything; make batch x length a multiple "
                          f"of a size near {best}, or set --config.moe.group_size to a divisor "
                          f"of {num_tokens}")
    return first


class SwitchFFN(nnx.Module):
    """Experts are ReLU MLPs, or gated-GELU ones (T5 v1.1 / Switch-XXL: gelu(x wi_0) * x wi_1).
    ``encoder``: whether this layer is in an encoder stack (experts-choose routing, not causal,
    routes decoders only with moe.noncausal_decoder). ``dense_dropout``: the model's dense
    dropout rate (ModelConfig.dropout), which the shared experts, dense FFNs, take; the routed
    experts take moe.expert_dropout."""

    def __init__(self, d_model: int, d_ff: int, cfg: MoeConfig, rngs: nnx.Rngs,
                 activation: str = "relu", encoder: bool = False,
                 init: Init = Init(0.1, True), dense_dropout: float = 0.0):
        self.cfg = cfg
        self.experts_choose = cfg.experts_choose(encoder)
        self.router = Router(d_model, cfg.num_experts, rngs, bias=cfg.balance == "bias",
                             init=init)
        for name, value in ffn_params(rngs, d_model, d_ff, activation, cfg.num_experts,
                                      init).items():
            setattr(self, name, value)
        if cfg.num_shared_experts:
            # DeepSeekMoE's shared experts: n dense experts of d_ff every token passes through,
            # summed, are one MLP of n * d_ff, laid out like a dense FFN (d_ff, not experts).
            self.shared = Mlp(d_model, cfg.num_shared_experts * d_ff, rngs, activation,
                              dense_dropout, init)

    def __call__(self, x_BLD, rng=None, valid_BL=None):
        """Returns y_BLD (zero for dropped tokens, plus the shared experts' output) and the
        routing losses and metrics.

        ``rng`` None means evaluation: no jitter, no dropout, the eval capacity factor. Routed
        experts drop at ``moe.expert_dropout`` (not the dense layers' rate), shared experts at
        ``dense_dropout``. ``valid_BL`` false marks padding, which is not routed (it takes no
        expert capacity) and counts in no metric (routing.Routing.metrics).
        """
        jitter_rng, drop_rng = split(rng, 2)
        y_BLD, stats = self._routed(x_BLD, rng is not None, valid_BL, jitter_rng, drop_rng)
        if self.cfg.num_shared_experts:
            y_BLD = y_BLD + self.shared(x_BLD, None if drop_rng is None
                                        else jax.random.fold_in(drop_rng, 1))
        return y_BLD, stats

    def _routed(self, x_BLD, train, valid_BL, jitter_rng, drop_rng):
        cfg, dt = self.cfg, x_BLD.dtype
        B, L, D = x_BLD.shape
        layout = active()
        exchange = layout and layout.exchange       # inside a pipeline's per-shard vmap
        per_sequence = not train and cfg.eval_groups == "sequence"    # batch-independent
        G = B if per_sequence else num_groups(B, L, cfg.group_size,
                                              layout.parts("groups") if layout else 1)
        N = B * L // G
        # An expert gets at most N of a group's assignments (a token's picks are distinct; an
        # experts-choose group of fewer tokens than slots, as in cached decoding, gives each
        # expert every token).
        C = min(cfg.capacity(N, train, self.experts_choose), N)
        bias_E = None if self.router.bias is None else self.router.bias[...]

        x_GND = constrain(x_BLD.reshape(G, N, D), ("groups", "group_size", "d_model"))
        # Routing is per token: keep it where the tokens are (the router weight is tiny).
        with jax.named_scope("routing"):
            logits_GNE = constrain(self.router(x_GND, cfg.jitter, jitter_rng),
                                   ("groups", "group_size", "experts"))
        valid_GN = None if valid_BL is None else valid_BL.reshape(G, N)
        if not self.experts_choose and (cfg.dispatch == "dropless" or (
                cfg.dispatch == "auto" and C == N and self._dropless_runs(x_BLD.shape))):
            # With room for every token (decoding: groups of one token), a capacity dispatch
            # would run every expert on every token; dropless computes the same sum, E x less.
            return self._dropless(x_BLD, logits_GNE, valid_GN, drop_rng, bias_E)
        index = cfg.dispatch != "einsum"                        # "index", or "auto" here
        # One CPU device, no expert dropout: the experts may compute only the kept picks
        # (measured on XLA:CPU only; elsewhere the slots, as before).
        kept_only = (index and not self.experts_choose and not exchange
                     and grouped.on_cpu_unless(KEPT_ONLY)
                     and (layout is None or layout.mesh.size == 1)
                     and (drop_rng is None or cfg.expert_dropout == 0.0))
        with jax.named_scope("routing"):
            if self.experts_choose:
                r = experts_choose_route(logits_GNE, C, valid_GN)
            else:
                r = route(logits_GNE, cfg.top_k, C, cfg.normalize_top_k, valid_GN, bias_E,
                          cfg.gates_sum_to_one, cfg.straight_through_steps != 0)
            # Pin the routing (indices or masks) to the tokens' devices, so the partitioner
            # moves tokens (one all-to-all each way) rather than routing.
            slot_dims = ("groups", "experts", "expert_capacity")
            if kept_only:
                pass                                # _kept_or_slots
            elif index:
                token_GEC = constrain(r.token_GEC, slot_dims)
                if self.experts_choose:
                    weight_GEC = constrain(r.weight_GEC.astype(dt), slot_dims)
                else:
                    pick_dims = ("groups", "group_size", None)
                    cell_GNP = constrain(jnp.where(r.kept_GNP, r.expert_GNP * C + r.slot_GNP,
                                                   cfg.num_experts * C), pick_dims)
                    gate_GNP = constrain(r.gate_GNP.astype(dt), pick_dims)
                    pick_GEC = constrain(r.pick_GEC, slot_dims)
            else:
                mask_dims = ("groups", "group_size", "experts", "expert_capacity")
                dispatch_GNEC = constrain(r.dispatch_GNEC.astype(dt), mask_dims)
                combine_GNEC = constrain(r.combine_GNEC.astype(dt), mask_dims)

        if kept_only:
            return self._kept_or_slots(x_GND, r, C).reshape(B, L, D), self._stats(r)
        # Dispatch where the tokens are, then move the expert dim onto its axis: all-to-all.
        with jax.named_scope("dispatch"):
            if index and not self.experts_choose:   # a gather each way (switchzoo.permute)
                x_EGCD = permute.dispatch(x_GND, token_GEC, cell_GNP)
            elif index:     # each slot's token (zero for an empty slot), group by group
                x_EGCD = jax.vmap(lambda x_ND, t_EC: x_ND.at[t_EC].get(mode="fill", fill_value=0),
                                  out_axes=1)(x_GND, token_GEC)
            else:
                x_EGCD = jnp.einsum("GND,GNEC->EGCD", x_GND, dispatch_GNEC)
            x_EGCD = constrain(x_EGCD, (None, "groups", "expert_capacity", "d_model"))
            if exchange:    # each shard's experts' slots from every shard: [E / n, n G, C, D]
                x_EGCD = jax.lax.all_to_all(x_EGCD, exchange, 0, 1, tiled=True)
            x_EGCD = constrain(x_EGCD, ("experts", "groups", "expert_capacity", "d_model"))

        with jax.named_scope("experts"):
            y_EGCD = mlp(x_EGCD, ffn_weights(self), _per_expert,
                         hidden=lambda h: constrain(h, ("experts", "groups", "expert_capacity",
                                                        "d_ff")),
                         dropout_fn=lambda h: dropout(h, cfg.expert_dropout, drop_rng))
            y_EGCD = constrain(y_EGCD, ("experts", "groups", "expert_capacity", "d_model"))
        with jax.named_scope("combine"):
            if exchange:    # the slots back to their groups' shards: [E, G, C, D]
                y_EGCD = jax.lax.all_to_all(y_EGCD, exchange, 1, 0, tiled=True)
            y_EGCD = constrain(y_EGCD, (None, "groups", "expert_capacity", "d_model"))
            if index:
                y_GQD = jnp.swapaxes(y_EGCD, 0, 1).reshape(G, -1, D)      # Q: E x C slots
                if self.experts_choose:     # each slot into its token, weighted (0..E a token)
                    y_GQD = y_GQD * weight_GEC.reshape(G, -1, 1)
                    y_GND = jax.vmap(lambda y_QD, t_Q: jnp.zeros((N, D), dt).at[t_Q].add(
                        y_QD, mode="drop"))(y_GQD, token_GEC.reshape(G, -1))
                else:                       # each token's kept picks' slots, weighted
                    y_GNPD = permute.combine(y_EGCD, cell_GNP, pick_GEC)
                    y_GND = jnp.einsum("GNPD,GNP->GND", y_GNPD, gate_GNP)
            else:
                y_GND = jnp.einsum("EGCD,GNEC->GND", y_EGCD, combine_GNEC)
            y_GND = constrain(y_GND, ("groups", "group_size", "d_model"))
        return y_GND.reshape(B, L, D), self._stats(r)

    def _stats(self, r) -> dict:
        return {"aux_loss": r.aux_loss, "z_loss": r.z_loss, **r.metrics,
                **self._balance(r.balance)}

    def _kept_or_slots(self, x_GND, r, C):
        """Tokens-choose on one device without expert dropout: the experts' MLP on the kept
        picks only, sorted by expert (``kept_experts``), where that is fewer rows than the
        E x G x C capacity slots (counting KEPT_EXPERT_ROWS per expert it runs), else on the
        slots as the index dispatch does. Either way the same sums of the same products: the
        routing (drops, gates) is ``r``'s."""
        G, N, D = x_GND.shape
        E, P, dt = self.cfg.num_experts, r.expert_GNP.shape[-1], x_GND.dtype
        expert_A = jnp.where(r.kept_GNP, r.expert_GNP, E).reshape(-1)   # E: dropped
        count_E = jnp.bincount(expert_A, length=E + 1)[:E]
        block = grouped.KEPT_BLOCK
        rows = jnp.sum(-(-count_E // block) * block + KEPT_EXPERT_ROWS * (count_E > 0))
        cell_GNP = jnp.where(r.kept_GNP, r.expert_GNP * C + r.slot_GNP, E * C)
        gate_GNP, w = r.gate_GNP.astype(dt), ffn_weights(self)

        def kept(x_GND):
            x_AD = jnp.repeat(x_GND.reshape(G * N, D), P, axis=0)      # a = n P + p
            return grouped.kept_experts(x_AD, expert_A, w).reshape(G, N, P, D)

        def slots(x_GND):
            x_EGCD = permute.dispatch(x_GND, r.token_GEC, cell_GNP)
            y_EGCD = mlp(x_EGCD, w, _per_expert)
            return permute.combine(y_EGCD, cell_GNP, r.pick_GEC)

        with jax.named_scope("experts"):
            y_GNPD = jax.lax.cond(rows < E * G * C, kept, slots, x_GND)
        return jnp.einsum("GNPD,GNP->GND", y_GNPD, gate_GNP)

    def _balance(self, balance) -> dict:
        """eq. 4's sums (routing.Balance) as stats, for the stack to pool over its layers
        (BALANCE_STATS): the "pooled" loss reduction reads them, and a pipeline recomputes
        eq. 4 from them over its micro-batches; moe.combine_losses drops them otherwise."""
        return dict(zip(BALANCE_STATS, balance))

    def _dropless_runs(self, x_shape) -> bool:
        return dropless.supports(active(), x_shape,
                                 {k: v.shape for k, v in ffn_weights(self).items()})

    def _dropless(self, x_BLD, logits_GNE, valid_GN, drop_rng, bias_E):
        """Every pick served: sort by expert, grouped matmul (switchzoo/dropless.py)."""
        cfg = self.cfg
        B, L, _ = x_BLD.shape
        c = choose(logits_GNE, cfg.top_k, cfg.normalize_top_k, valid_GN, bias_E,
                   cfg.gates_sum_to_one, cfg.straight_through_steps != 0)
        valid_BL = (jnp.ones((B, L), bool) if valid_GN is None
                    else valid_GN.reshape(B, L).astype(bool))
        y_BLD = dropless.layer(x_BLD, c.index_GNP.reshape(B, L, -1),
                               c.gates_GNP.reshape(B, L, -1), valid_BL, ffn_weights(self),
                               cfg.num_experts, active(), cfg.grouped_matmul, cfg.block_size,
                               cfg.expert_dropout, drop_rng)
        stats = {"aux_loss": c.aux_loss, "z_loss": c.z_loss,
                 "dropped_fraction": jnp.zeros((), jnp.float32), **c.metrics,
                 **self._balance(c.balance)}
        return y_BLD, stats


def combine_losses(stacks: list[list[dict]], reduction: str = "sum") -> dict:
    """Combines the routing losses of the Switch layers of the model's ``stacks`` (each a
    Stack's stats) by ``reduction`` (MoeConfig.loss_reduction): over every layer of both stacks
    their sum (Mesh-TensorFlow) or their mean (T5X); or "pooled", transformers'
    SwitchTransformersForConditionalGeneration: per stack one Switch eq. 4 over its layers
    pooled (routing.pooled_aux_loss) and its layers' mean z-loss, the stacks' terms added.
    Joins the metrics along the leading layer axis."""
    joined = [{k: jnp.concatenate([s[k] for s in stack]) for k in stack[0]}
              for stack in stacks if stack]
    if not joined:
        zero = jnp.zeros((), jnp.float32)
        return {"aux_loss": zero, "z_loss": zero}
    balance = [Balance(*(s.pop(k) for k in BALANCE_STATS)) for s in joined]  # eq. 4's sums
    if reduction == "pooled":
        aux = sum(pooled_aux_loss(b) for b in balance)
        z = sum(jnp.mean(s["z_loss"]) for s in joined)
    out = {k: jnp.concatenate([s[k] for s in joined]) for k in joined[0]}
    if reduction == "pooled":
        out["aux_loss"], out["z_loss"] = aux, z
    else:
        for k in ("aux_loss", "z_loss"):
            out[k] = jnp.sum(out[k]) if reduction == "sum" else jnp.mean(out[k])
    return out

