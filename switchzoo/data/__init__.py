"""Input pipelines. For now: a byte-level LM stream over real text found on every machine."""
from switchzoo.data.text import byte_lm_batches, default_corpus

__all__ = ["byte_lm_batches", "default_corpus"]
