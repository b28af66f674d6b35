"""Model hyper-parameters as frozen dataclasses (the catalogue in models/ fills them in)."""
from __future__ import annotations

import dataclasses
import math

# Rematerialisation of each block (and of each scanned group of blocks) in the backward pass,
# named after the jax.checkpoint policy each stands for (switchzoo.transformer.REMAT_POLICIES):
# "minimal" keeps the projections and the attention context, MaxText's minimal_with_context.
REMAT = ("none", "full", "dots", "minimal")
# How attention runs (switchzoo.attention_impl.attention_impl decides "auto" once per run): the
# reference einsums, jax.nn.dot_product_attention's XLA or cuDNN (fused) implementation, or
# JAX's Pallas flash-attention kernel for TPUs (jax.experimental.pallas.ops.tpu).
ATTENTION = ("auto", "reference", "xla", "cudnn", "pallas")
ROUTERS = ("tokens_choose", "experts_choose")
BALANCE = ("aux_loss", "bias")
# How a model's routing losses combine over its Switch layers: "sum" (Mesh-TensorFlow, in
# which the Switch paper's alpha = 0.01 was set: each layer adds alpha x its loss), "mean"
# (T5X's _expert_losses: alpha weighs the average layer, so it does not grow with depth) or
# "pooled" (transformers' SwitchTransformers, which models read from Hugging Face take: per
# stack one aux loss of its Switch layers' routing pooled and the mean z-loss, stacks added).
LOSS_REDUCTIONS = ("sum", "mean", "pooled")
INIT_DISTRIBUTIONS = ("normal", "truncated_normal")


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """A Switch feed-forward layer: routing, capacity, losses (Switch Transformer, sec. 2)."""
    num_experts: int = 8
    top_k: int = 1                       # 1: Switch; 2: GShard top-2
    normalize_top_k: bool = True         # top-k gates renormalised to sum to one (k > 1)
    group_size: int = 1024               # tokens routed together (0: one group per sequence)
    # Evaluation and generation: "sequence" routes each sequence as its own group, so that an
    # example's output never depends on the others in its batch (nor on the batch size);
    # "train": groups of group_size as in training (a token may be dropped because of its
    # neighbours). A sequence's capacity follows its padded length.
    eval_groups: str = "sequence"
    expert_capacity: int | None = None   # fixed slots per expert per group (Hugging Face
                                         # checkpoints); overrides the capacity factors
    train_capacity_factor: float = 1.25
    eval_capacity_factor: float = 2.0
    min_capacity: int = 4
    jitter: float = 0.0                  # multiplicative router-input noise in training (0.01)
    expert_dropout: float = 0.0          # dropout inside the experts (Switch fine-tuning: 0.4)
    aux_loss_weight: float = 0.01        # Switch eq. 4 alpha
    z_loss_weight: float = 0.001         # router z-loss (ST-MoE)
    # Which FFNs are Switch layers, per stack: layer i when i % sparse_every == sparse_offset
    # % sparse_every. flaxformer/t5x put them last in each run of sparse_every (offset -1, the
    # default); Hugging Face marks i % k == 1 (offset 1). Explicit lists override the rule.
    sparse_every: int = 2
    sparse_offset: int = -1
    sparse_layers: tuple[int, ...] | None = None           # decoder (or decoder-only) stack
    encoder_sparse_layers: tuple[int, ...] | None = None   # encoder stack
    # How tokens reach their experts: "index" (each capacity slot gathers its token, each token
    # gathers its slots' outputs; tokens past capacity dropped), "einsum" (the same routing by
    # one-hot dispatch/combine masks: 2 N C E D flops per group each way, the oracle),
    # "dropless" (sorted by expert, grouped matmul, nothing dropped; capacity factors unused;
    # switchzoo/dropless.py), or "auto": index, except dropless where the capacity holds every
    # token of a group (the same sum, less work).
    dispatch: str = "auto"
    grouped_matmul: str = "auto"         # dropless: "auto" | "blocks" | "ragged_dot"
    block_size: int = 128                # dropless "blocks": rows per block
    # Who chooses: "tokens_choose" (each token its top-k experts, capacity drops the rest) or
    # "experts_choose" (Zhou et al. 2022: each expert its top-C tokens of a group; a token gets
    # 0..E experts; balanced by construction). experts_choose looks at every token of a group,
    # so it is not causal: it routes encoder stacks, and decoder stacks only with
    # noncausal_decoder (training and perplexity). Generation with such a decoder runs (a
    # cached step routes the batch's new tokens as one group, every expert taking up to all of
    # them) but is not meaningful: training let each token's routing see later tokens.
    # Experts-choose always dispatches into capacity slots (index or einsum; not dropless).
    router: str = "tokens_choose"
    noncausal_decoder: bool = False
    # Load balancing: "aux_loss" (Switch eq. 4, weight aux_loss_weight) or "bias" (DeepSeek-V3:
    # a per-expert bias added to the router probabilities for the choice only, moved by
    # bias_rate * sign(mean load - load) after each step, outside the gradient; no aux loss).
    balance: str = "aux_loss"
    bias_rate: float = 0.001
    num_shared_experts: int = 0          # DeepSeekMoE: dense experts every token passes through
    loss_reduction: str = "sum"          # routing losses over layers: one of LOSS_REDUCTIONS
    # Each token's combine weights renormalised over the experts serving it: E copies of a
    # dense MLP compute it (sparse upcycling, Komatsuzaki et al. 2022 app. B.7; switchzoo.upcycle
    # turns it on). The router's gradient is the renormalised gate's own (for top-1 a constant 1,
    # so none: the paper's "vanishing routing gradient", left as is), or for the first
    # straight_through_steps steps of the run (-1: every step) the raw probabilities'
    # (straight-through; switchzoo.upcycle.straight_through_phase).
    gates_sum_to_one: bool = False
    straight_through_steps: int = 0

    def __post_init__(self):
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"moe.top_k={self.top_k}: each token picks 1 (Switch) or 2 (GShard) "
                             f"experts, at most num_experts={self.num_experts}")
        if min(self.train_capacity_factor, self.eval_capacity_factor) <= 0:
            raise ValueError("moe capacity factors must be positive (e.g. 1.25 for training, "
                             "2.0 for evaluation)")
        if self.eval_groups not in ("sequence", "train"):
            raise ValueError(f"moe.eval_groups={self.eval_groups!r}: use 'sequence' (each "
                             "example routed alone at evaluation) or 'train' (moe.group_size)")
        if self.dispatch not in ("auto", "einsum", "dropless", "index"):
            raise ValueError(f"moe.dispatch={self.dispatch!r}: use 'index' (capacity slots, "
                             "gathered), 'einsum' (capacity slots, one-hot masks), 'dropless' "
                             "(sorted, grouped matmul) or 'auto'")
        if self.grouped_matmul not in ("auto", "blocks", "ragged_dot") or self.block_size < 1:
            raise ValueError(f"moe.grouped_matmul={self.grouped_matmul!r} / block_size="
                             f"{self.block_size}: use 'auto', 'blocks' or 'ragged_dot' and a "
                             "block size >= 1")
        if self.router not in ROUTERS:
            raise ValueError(f"moe.router={self.router!r}: use one of {', '.join(ROUTERS)}")
        if self.balance not in BALANCE:
            raise ValueError(f"moe.balance={self.balance!r}: use one of {', '.join(BALANCE)}")
        if self.balance == "bias" and self.router == "experts_choose":
            raise ValueError("moe.balance='bias' with moe.router='experts_choose': experts-choose "
                             "stacks are balanced by construction and the bias is not built for "
                             "them; use moe.balance='aux_loss' (it then balances only the "
                             "tokens-choose decoder of an encoder-decoder) or "
                             "router='tokens_choose'")
        if self.router == "experts_choose" and self.dispatch == "dropless":
            raise ValueError("moe.dispatch='dropless' with moe.router='experts_choose': each "
                             "expert fills its capacity slots, which only the index and einsum "
                             "dispatches have; use moe.dispatch='index' (or 'auto') or "
                             "router='tokens_choose'")
        if self.loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"moe.loss_reduction={self.loss_reduction!r}: use 'sum' (over "
                             "Switch layers, Mesh-TensorFlow and the Switch paper), 'mean' "
                             "(T5X) or 'pooled' (Hugging Face transformers)")
        if self.gates_sum_to_one and self.router == "experts_choose":
            raise ValueError("moe.gates_sum_to_one with moe.router='experts_choose': only "
                             "tokens-choose gates are renormalised; use router='tokens_choose' "
                             "or gates_sum_to_one=false")
        if self.straight_through_steps < -1 or (self.straight_through_steps and
                                                 not self.gates_sum_to_one):
            raise ValueError(f"moe.straight_through_steps={self.straight_through_steps}: use 0 "
                             "(off), N > 0 (the run's first N steps) or -1 (every step), and "
                             "only with moe.gates_sum_to_one=true")
        if self.num_shared_experts < 0 or self.bias_rate < 0:
            raise ValueError(f"moe.num_shared_experts={self.num_shared_experts} / bias_rate="
                             f"{self.bias_rate}: both must be >= 0")
        if self.group_size < 0 or self.min_capacity < 1:
            raise ValueError(f"moe.group_size={self.group_size} / min_capacity="
                             f"{self.min_capacity}: use a group size >= 0 (0: one group per "
                             "sequence) and a minimum capacity >= 1")

    def capacity(self, group_size: int, train: bool, experts_choose: bool = False) -> int:
        """Slots per expert per group: round(N x factor / E), at least min_capacity, whatever
        top_k is (Switch eq. 3; Mesh-TensorFlow's top-2 gating and flaxformer's routers use
        the same slots for k = 1 and 2, so the paper's Table 1 compares top-1 and top-2 at one
        factor). A top-k router's k x N picks then share N x factor slots per group: for
        k-scaled slots (MaxText's convention) give the factor times k. An experts-choose stack
        uses the training factor in evaluation too (its factor is how many experts a token
        gets on average, part of the function; the stack says, since an encoder-decoder's
        causal decoder routes tokens-choose with the same config)."""
        if self.expert_capacity is not None:
            return self.expert_capacity
        train = train or experts_choose
        factor = self.train_capacity_factor if train else self.eval_capacity_factor
        # flaxformer's int(round(...)); round(x, 9) first so that a product that should be a
        # whole number (100 x 1.1 / 10 = 11.000000000000002) is one.
        c = int(round(round(group_size * factor / self.num_experts, 9)))
        return max(c, self.min_capacity)

    def experts_choose(self, encoder: bool) -> bool:
        """Whether the Switch layers of this stack route experts-choose."""
        return self.router == "experts_choose" and (encoder or self.noncausal_decoder)

    def is_sparse(self, layer: int, encoder: bool = False) -> bool:
        explicit = self.encoder_sparse_layers if encoder else self.sparse_layers
        if explicit is not None:
            return layer in explicit
        if self.sparse_every <= 0:
            return False
        return layer % self.sparse_every == self.sparse_offset % self.sparse_every


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    num_heads: int
    d_kv: int
    d_ff: int
    num_layers: int                      # decoder layers
    num_encoder_layers: int = 0          # 0: decoder-only LM; else a T5 encoder-decoder
    activation: str = "relu"             # dense FFNs: "relu" or "gated-gelu" (T5 v1.1)
    dropout: float = 0.0
    relpos_buckets: int = 32
    relpos_max_distance: int = 128
    tie_embeddings: bool = True          # tied output layer, logits scaled by d_model**-0.5
    dtype: str = "float32"               # activation dtype; params and router stay float32
    # Initialisation of every weight matrix (attention, dense and expert FFNs, router, untied
    # output layer): std sqrt(init_scale / fan-in) (Switch sec. 2.4: scale 0.1, truncated
    # normal; T5 / Mesh-TF: 1.0, normal). Embeddings and relative-position biases keep std 1.
    init_scale: float = 1.0
    init_distribution: str = "normal"    # one of INIT_DISTRIBUTIONS
    moe: MoeConfig | None = None
    # Execution, not architecture: the same weights compute the same function either way.
    # scan_layers: each stack runs as a lax.scan over its repeating group of layers (e.g. a
    # (dense, sparse) pair), parameters stacked along a leading 'layers' dim, so compile time
    # and program size stay flat in depth (transformer.stack_layers converts a checkpoint).
    scan_layers: bool = False
    remat: str = "none"                  # one of REMAT
    # attention: one of ATTENTION; "auto" is cuDNN's fused kernel on a GPU with bfloat16/float16
    # activations, the Pallas flash kernel on a TPU, else the reference einsums
    # (switchzoo.attention_impl says which and why).
    attention: str = "auto"
    # Pipelining (switchzoo/pipeline.py), where the layout splits 'layers' over a stage axis:
    # micro-batches per step (0: as many as stages) and rounds of a circular schedule (1: GPipe).
    pipeline_microbatches: int = 0
    pipeline_repeats: int = 1

    def __post_init__(self):
        if self.activation not in ("relu", "gated-gelu"):
            raise ValueError(f"activation '{self.activation}' is not supported; use 'relu' or "
                             "'gated-gelu'")
        if not self.init_scale > 0 or self.init_distribution not in INIT_DISTRIBUTIONS:
            raise ValueError(f"init_scale={self.init_scale} / init_distribution="
                             f"{self.init_distribution!r}: use a scale > 0 (Switch: 0.1, T5: "
                             f"1.0) and one of {', '.join(INIT_DISTRIBUTIONS)}")
        if self.remat not in REMAT:
            raise ValueError(f"remat={self.remat!r} is not a rematerialisation policy; use one "
                             f"of {', '.join(REMAT)}")
        if self.pipeline_microbatches < 0 or self.pipeline_repeats < 1:
            raise ValueError(f"pipeline_microbatches={self.pipeline_microbatches} / "
                             f"pipeline_repeats={self.pipeline_repeats}: use micro-batches >= 0 "
                             "(0: one per stage) and repeats >= 1 (1: GPipe)")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention={self.attention!r} is not an attention implementation; "
                             f"use one of {', '.join(ATTENTION)}")
        if (self.moe is not None and self.moe.router == "experts_choose"
                and not self.is_encoder_decoder and not self.moe.noncausal_decoder):
            raise ValueError("moe.router='experts_choose' in a decoder-only model: experts-choose "
                             "routing is not causal (each expert picks among the whole group); "
                             "set --config.moe.noncausal_decoder=true (training and perplexity "
                             "only, not generation) or use moe.router='tokens_choose'")

    @property
    def is_encoder_decoder(self) -> bool:
        """A T5 encoder-decoder (else a decoder-only LM): the one place this is decided."""
        return self.num_encoder_layers > 0

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """The inverse of to_dict, also after a JSON round trip (lists back to tuples)."""
        moe = d.get("moe")
        if moe is not None:
            moe = MoeConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in moe.items()})
        return cls(**{**d, "moe": moe})
