"""The dimension vocabulary: one table of logical dimension names.

Every parameter annotation, activation constraint, einsum string and layout string uses these
names (Mesh-TensorFlow's, so the papers' layout strings run as written). The letter is the one
used in variable suffixes (``x_BLD``) and einsum subscripts; tests/test_dims.py checks both.
"""

VOCABULARY: dict[str, tuple[str, str]] = {
    # name: (letter, meaning)
    "batch": ("B", "examples (sequences)"),
    "length": ("L", "positions in a sequence"),
    "d_model": ("D", "model width"),
    "heads": ("H", "attention heads"),
    "d_kv": ("K", "width of one head"),
    "d_ff": ("F", "feed-forward hidden width (dense and inside each expert)"),
    "vocab": ("V", "vocabulary"),
    "experts": ("E", "experts of one MoE layer"),
    "expert_capacity": ("C", "slots per expert per group"),
    "groups": ("G", "routing groups (tokens are routed within a group)"),
    "group_size": ("N", "tokens per group"),
    "relpos_buckets": ("R", "relative-position buckets"),
    "picks": ("P", "experts picked per token (the k of top-k routing)"),
    "assignments": ("A", "(token, picked expert) pairs of dropless dispatch"),
    "beams": ("W", "hypotheses kept per example in beam search (its width)"),
    "slots": ("Q", "expert capacity slots of a group, all experts' together (E x C): what an "
                   "index dispatch gathers from and into"),
    "chunks": ("J", "runs of positions the train loss makes logits for one at a time"),
    "layers": ("Z", "layers of a scanned stack: the leading dim of its stacked parameters "
                    "(split only over a pipeline's stage axis: switchzoo/pipeline.py)"),
}

# Where both occur, these letters stand for the length of the source and of the target.
LENGTH_LETTERS = {"S": "source length", "T": "target length"}

NAMES = tuple(VOCABULARY)
LETTERS = {name: letter for name, (letter, _) in VOCABULARY.items()}

# Activations whose layout is not given explicitly follow another dimension's: routing groups
# are slices of the batch, so they are split the way the batch is.
ALIASES = {"groups": "batch"}


def check(dims: tuple[str, ...], what: str) -> tuple[str, ...]:
    """Returns ``dims`` if every name is in the vocabulary, else raises naming ``what``.
    ``None`` marks an axis deliberately left unsharded (activations only)."""
    unknown = [d for d in dims if d is not None and d not in VOCABULARY]
    if unknown:
        raise ValueError(
            f"{what}: unknown dimension name(s) {unknown}; use names from switchzoo.dims "
            f"({', '.join(NAMES)})")
    return tuple(dims)
