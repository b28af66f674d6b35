"""switchzoo: Switch-MoE Transformers with named dimensions on JAX / Flax NNX."""
import importlib

from switchzoo.config import ModelConfig, MoeConfig

__all__ = ["ModelConfig", "MoeConfig", "from_pretrained", "init", "Model", "dims", "layout", "zoo",
           "state", "steps", "hf"]


def __getattr__(name):
    # Submodules load on first use, so `python -m switchzoo.layout` runs without a warning.
    if name in ("from_pretrained", "Model", "init"):
        return getattr(importlib.import_module("switchzoo.api"), name)
    if name in __all__:
        return importlib.import_module(f"switchzoo.{name}")
    raise AttributeError(f"module 'switchzoo' has no attribute '{name}'")
