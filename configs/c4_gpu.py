"""python train.py --config=configs/c4_gpu.py:model=switch_base_8 --workdir=DIR \
    --config.data.source=files --config.data.train_files=docs.txt

configs/c4.py's span-corruption recipe (Adafactor per expert, T5's schedule, 0.1x truncated
init, no dropout, capacity 1.25) on the GPUs of one host, with the step an accelerator wants:
bfloat16 activations (parameters, router and loss in float32: the paper's selective
precision), cuDNN's fused attention where it serves (`attention=auto`; dropout 0 lets it serve
training steps), layers scanned (compile time flat in depth), remat `minimal` (the projections
and the attention context kept, the rest recomputed: no [B, H, T, S] scores or routing masks
saved) and the loss in chunks. Every device holds a batch shard of 32 sequences of 512 input
tokens; the experts stay whole on each (mesh data:-1). On a host of 8 GPUs put them on an
expert axis instead: `:mesh=data:1,model:1,expert:8` (dp_ep: batch over data+expert).
Variant keys: as configs/c4.py (model, cf, top_k, steps, layout, mesh).
"""
from switchzoo.configs import base, c4


def get_config(arg: str | None = None):
    c = c4.get_config()
    c.model = "switch_base_8"
    c.mesh = "data:-1,model:1,expert:1"
    c.per_device_batch_size = 32
    c.dtype, c.scan_layers, c.remat = "bfloat16", True, "minimal"
    c.attention = "auto"
    base.apply_variant(c, arg, c4.VARIANTS)
    return c
