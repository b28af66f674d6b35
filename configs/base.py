"""Defaults shared by every run config (field names as in the Flax examples), and the
``file.py:key=value,...`` variant parser. Not a run config itself."""
import ml_collections
from ml_collections import config_dict

from switchzoo import data, tasks


def get_base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = "switch_base_tiny"          # a catalogue name (python -m switchzoo.zoo)
    c.task = "translation"                # translation, span_corruption, text2text (a downstream
                                          # task: finetune.*; encoder-decoder); lm
    c.layout = "data_parallel"            # a preset in layouts/ or a layout string
    c.mesh = ""                           # empty: the preset's mesh
    c.seed = 0                            # parameters, dropout and the data order
    c.num_train_steps = 1000              # the step the run ends at (a resume trains on to it)
    c.log_every_steps = 50                # a metrics.jsonl row (and TensorBoard) every N steps
    c.eval_every_steps = 500              # held-out loss (a fine-tune: its task score) every N
    c.checkpoint_every_steps = 500        # an Orbax checkpoint every N steps (and at the end)
    c.keep_checkpoints = 3                # the newest N checkpoints are kept
    # A resumed run's controls (switchzoo.record, switchzoo.resume), acting once, never saved:
    c.restore_step = config_dict.placeholder(int)   # resume from this checkpoint, not the
                                                    # newest (newer ones are set aside, kept)
    c.allow_changes = False               # resume with changed training settings, recorded
                                          # in config.json's "changes" at the resumed step
    c.per_device_batch_size = 16          # rows per device; the global batch is this x devices
    c.max_length = 128                    # tokens per packed row (inputs and targets)
    c.grad_accum_steps = 1                # micro-batches summed into one update
    c.optimizer = "adafactor"             # "adafactor" (T5/Switch) or "adamw"
    c.learning_rate = 0.01                # the peak rate of the schedule
    c.warmup_steps = 1000                 # steps before the decay (rsqrt: at the peak;
                                          # linear_rsqrt: ramping up to it)
    c.schedule = "rsqrt"                  # T5's shape: learning_rate * sqrt(warmup / max(step,
                                          # warmup)); T5's own constants: 0.01 and 10,000
                                          # (configs/c4.py); "linear_rsqrt": a linear ramp to it
    c.weight_decay = 0.0                  # AdamW's decoupled weight decay
    c.moments_dtype = "float32"           # AdamW's two moments stored in this dtype
                                          # (bfloat16: half the optimizer's bytes)
    c.router_learning_rate_scale = 1.0    # multiplies the routers' updates (off: 1.0)
    c.router_freeze_step = 0              # the routers stop moving from this step on
                                          # (StableMoE's second stage; off: 0)
    c.momentum = 0.0                      # Adafactor's first moment (this decay) on every
                                          # update (off: 0.0; optax's and T5X's beta1)
    c.expert_momentum = 0.0               # Adafactor's first moment (this decay) on the
                                          # experts' updates alone (off: 0.0)
    c.label_smoothing = 0.0               # of the one-hot targets (T5: 0.0)
    c.loss_chunk = 8192                   # tokens per chunk (per device) of the train loss's
                                          # logits, never held whole (switchzoo.loss); 0: the
                                          # full logits
    c.dropout = 0.1                       # of activations in training (T5, Switch: 0.1)
    c.dtype = "float32"                   # activations; "bfloat16" keeps params and router f32
    c.scan_layers = False                 # scan each stack's repeating (dense, sparse) group
    c.remat = "none"                      # rematerialise each block: none | full | dots |
                                          # minimal (keep projections and attention context)
    c.attention = "auto"                  # the attention kernel (auto: cuDNN's fused kernel
                                          # on a GPU in bfloat16, else reference)
    c.shard_optimizer_over_data = False   # weight-update sharding (arXiv 2004.13336)
    c.pipeline_microbatches = 0           # with 'layers:stage' in the layout: micro-batches per
                                          # step (0: one per stage; switchzoo/pipeline.py)
    c.pipeline_repeats = 1                # rounds of a circular pipeline schedule (1: GPipe)
    c.init_scale = config_dict.placeholder(float)   # init of the weight matrices the run makes
    c.init_distribution = config_dict.placeholder(str)  # (None: the model's; Switch: 0.1,
                                                        # truncated_normal); init_from's load
    c.init_from = ""                      # a Hugging Face directory (or switchzoo workdir) to
                                          # start from: its weights, a fresh optimizer
    c.distill = ml_collections.ConfigDict()   # Switch paper sec. 4.2: distil a teacher run
    c.distill.teacher = ""                # the teacher: a switchzoo workdir (or HF directory)
    c.distill.weight = 0.25               # of the teacher's probabilities; 1 - weight: labels
    c.moe = ml_collections.ConfigDict()   # overrides of the catalogue's routing (None: keep)
    c.moe.top_k = config_dict.placeholder(int)        # experts per token (Switch: 1)
    c.moe.train_capacity_factor = config_dict.placeholder(float)  # slots per expert x
                                                                  # tokens/experts, training
    c.moe.eval_capacity_factor = config_dict.placeholder(float)   # the same in evaluation
    c.moe.group_size = config_dict.placeholder(int)   # tokens routed together (0: a sequence)
    c.moe.eval_groups = config_dict.placeholder(str)   # "sequence" (each example alone) | "train"
    c.moe.dispatch = config_dict.placeholder(str)  # "auto" | "index" | "einsum" | "dropless"
    c.moe.grouped_matmul = config_dict.placeholder(str)   # dropless: auto | blocks | ragged_dot
    c.moe.block_size = config_dict.placeholder(int)   # dropless: rows per grouped-matmul block
    c.moe.aux_loss_weight = config_dict.placeholder(float)  # load-balancing loss (Switch: 0.01)
    c.moe.z_loss_weight = config_dict.placeholder(float)    # router z-loss (ST-MoE: 0.001)
    c.moe.jitter = config_dict.placeholder(float)           # router input noise in training
    c.moe.expert_dropout = config_dict.placeholder(float)   # dropout inside experts (fine-tuning)
    c.moe.router = config_dict.placeholder(str)       # tokens_choose | experts_choose
    c.moe.noncausal_decoder = config_dict.placeholder(bool)  # experts_choose in decoders too
    c.moe.balance = config_dict.placeholder(str)      # aux_loss | bias (DeepSeek-V3)
    c.moe.bias_rate = config_dict.placeholder(float)  # bias balancing: step of the bias
    c.moe.num_shared_experts = config_dict.placeholder(int)  # DeepSeekMoE shared experts
    c.moe.loss_reduction = config_dict.placeholder(str)  # routing losses over layers: sum | mean | pooled
    c.moe.gates_sum_to_one = config_dict.placeholder(bool)  # upcycling's renormalised gates
    c.moe.straight_through_steps = config_dict.placeholder(int)  # 0 off, N first N, -1 all
    c.data = data.default_config()
    c.finetune = tasks.default_config()   # task=text2text: the downstream task (configs/finetune.py)
    c.eval = ml_collections.ConfigDict()
    c.eval.num_beams = 4              # beam search width for BLEU (1: greedy)
    c.eval.length_penalty = 0.6       # beam search's length normalisation alpha (T5: 0.6)
    c.eval.max_decode_length = 64     # tokens decoded per translation at most
    c.eval.max_examples = 500         # translated for BLEU; 0: perplexity only
    return c


def get_paper_scale() -> ml_collections.ConfigDict:
    """The base with the settings of a full-size run on a prepared tfds dataset."""
    c = get_base()
    c.num_train_steps = 100_000
    c.per_device_batch_size = 16          # rows per device; the global batch is this x devices
    c.max_length = 256
    c.warmup_steps = 10_000
    c.eval_every_steps = 5000
    c.checkpoint_every_steps = 2000
    c.data.source = "tfds"
    c.data.vocab_size = 32000
    return c


BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _leaf(c: ml_collections.ConfigDict, key: str):
    """(node, leaf) of a dotted field, or None when ``key`` names no field."""
    *parents, leaf = key.split(".")
    node = c
    for part in parents:
        node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
        return None
    return node, leaf


def set_field(c: ml_collections.ConfigDict, key: str, text: str) -> None:
    """Sets the dotted field ``key`` from ``text``, typed as the field is; bools take only
    true/false/1/0/yes/no."""
    found = _leaf(c, key)
    if found is None:
        raise ValueError(f"'{key}' is not a config field")
    node, leaf = found
    kind = node.get_type(leaf)
    try:
        if kind is bool:
            if text.lower() not in BOOLS:
                raise ValueError
            value = BOOLS[text.lower()]
        else:
            value = kind(text) if kind not in (type(None), object) else text
    except ValueError:
        allowed = "true/false/1/0/yes/no" if kind is bool else f"a valid {kind.__name__}"
        raise ValueError(f"config field {key}='{text}' is not {allowed}") from None
    node[leaf] = value


def apply_variant(c: ml_collections.ConfigDict, arg: str | None, aliases: dict) -> None:
    """Applies ``key=value,...`` (keys: config fields, dotted, or the file's aliases); a key that
    is not a field is an error, not a new field. A value may hold commas
    (``mesh=data:2,model:2``): a piece that does not start with a known ``key=`` continues the
    value before it."""
    items = []
    for piece in (arg or "").split(","):
        key, sep, _ = piece.partition("=")
        if sep and (key in aliases or _leaf(c, key) is not None):
            items.append(piece)
        elif items and piece:
            items[-1] += "," + piece
        elif piece:
            raise ValueError(f"config variant '{piece}' is not key=value with a known key; keys: "
                             f"{', '.join(sorted(aliases))} or any config field")
    for item in items:
        key, _, value = item.partition("=")
        set_field(c, aliases.get(key, key), value)
