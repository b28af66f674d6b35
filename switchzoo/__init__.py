"""switchzoo: Switch-MoE Transformers with named dimensions on JAX / Flax NNX."""
from switchzoo import dims, layout, zoo
from switchzoo.config import ModelConfig, MoeConfig

__all__ = ["dims", "layout", "zoo", "ModelConfig", "MoeConfig"]
