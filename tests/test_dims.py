"""The vocabulary in switchzoo/dims.py is exactly what the code and the shipped layouts use."""
import pathlib
import re

import jax
import jax.numpy as jnp

from switchzoo import dims, layout as L, training, transformer, zoo

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Recording(L.Layout):
    """A layout that notes every activation constraint it is asked for."""
    seen: set = set()

    def constrain(self, x, names):
        Recording.seen.update(n for n in names if n is not None)
        return super().constrain(x, names)


def names_used_by_models() -> set[str]:
    """Parameter and activation dims of a traced training forward pass of the smallest
    catalogue model of every kind (abstractly: nothing is allocated)."""
    used = set()
    lay = Recording({}, L.make_mesh("data:1", devices=jax.devices()[:1]))
    kinds = {}

    def size(cfg):
        return cfg.d_model * cfg.num_layers * (cfg.moe.num_experts if cfg.moe else 1)
    for name in zoo.names():
        cfg = zoo.get(name)
        key = (bool(cfg.num_encoder_layers), cfg.moe is not None, cfg.activation)
        if key not in kinds or size(cfg) < size(kinds[key]):
            kinds[key] = cfg
    ids = jnp.ones((2, 16), jnp.int32)
    for cfg in kinds.values():
        _, _, param_dims = training.abstract_model(cfg)
        used.update(d for ds in param_dims.values() for d in ds)
        def forward(ids):
            model = transformer.build(cfg)
            args = (ids, ids) if cfg.num_encoder_layers else (ids,)
            return model(*args, rng=jax.random.key(0))
        with L.use(lay):
            jax.eval_shape(forward, ids)
    return used | Recording.seen


def einsum_letters() -> set[str]:
    letters = set()
    for path in (ROOT / "switchzoo").rglob("*.py"):
        for spec in re.findall(r'einsum\(\s*"([^"]+)"', path.read_text()):
            letters.update(c for c in spec if c.isalpha())
    return letters


def test_every_name_the_code_uses_is_in_the_vocabulary_and_every_entry_is_used():
    used = names_used_by_models()
    assert used <= set(dims.NAMES), used - set(dims.NAMES)
    letters = einsum_letters()
    # S and T stand for source and target length where both occur (DESIGN.md).
    known = set(dims.LETTERS.values()) | {"S", "T"}
    assert letters <= known, f"einsum letters outside the vocabulary: {letters - known}"
    unused = {n for n in dims.NAMES if n not in used and dims.LETTERS[n] not in letters}
    assert not unused, f"vocabulary entries no code uses: {unused}"


def test_every_rule_in_a_shipped_layout_is_used_by_some_model():
    used = names_used_by_models()
    for preset in L.presets().values():
        rules = L.parse_layout(preset.layout, tuple(L.parse_mesh(preset.mesh, 8).axes))
        assert set(rules) <= used, f"{preset.name}: rules for unused dims {set(rules) - used}"


def test_letters_are_unique():
    assert len(set(dims.LETTERS.values())) == len(dims.LETTERS)
