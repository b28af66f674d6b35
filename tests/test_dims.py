"""The vocabulary in switchzoo/dims.py is exactly what the code and the shipped layouts use."""
import functools
import pathlib
import re

import jax
import jax.numpy as jnp

from switchzoo import dims, layout as L, state, transformer, zoo

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Recording(L.Layout):
    """A layout that notes every activation constraint it is asked for."""
    seen: set = set()

    def constrain(self, x, names):
        Recording.seen.update(n for n in names if n is not None)
        return super().constrain(x, names)


@functools.cache
def names_used_by_models() -> frozenset[str]:
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
        for form in (cfg, cfg.replace(scan_layers=True)):      # scanned: the 'layers' dim
            _, _, param_dims = state.abstract_model(form)
            used.update(d for ds in param_dims.values() for d in ds)
        def forward(ids):
            model = transformer.build(cfg)
            args = (ids, ids) if cfg.num_encoder_layers else (ids,)
            return model(*args, rng=jax.random.key(0))
        with L.use(lay):
            jax.eval_shape(forward, ids)
    return frozenset(used | Recording.seen)


def source_files():
    return sorted((ROOT / "switchzoo").rglob("*.py"))


def einsum_letters() -> set[str]:
    letters = set()
    for path in source_files():
        for spec in re.findall(r'einsum\(\s*"([^"]+)"', path.read_text()):
            letters.update(c for c in spec if c.isalpha())
    return letters


# A shape suffix: a lower-case name, an underscore, then capitals ending the word (x_BLD,
# probs_GNE); constants (NEG_INF) start with a capital and are not suffixes.
SUFFIX = re.compile(r"\b[a-z][a-z0-9_]*?_([A-Z]+)\b")


def suffix_letters() -> dict[str, set[str]]:
    """{letter: the names using it} over every variable suffix in the library."""
    found: dict[str, set[str]] = {}
    for path in source_files():
        for m in SUFFIX.finditer(path.read_text()):
            for c in m.group(1):
                found.setdefault(c, set()).add(f"{path.name}:{m.group(0)}")
    return found


KNOWN = set(dims.LETTERS.values()) | set(dims.LENGTH_LETTERS)


def test_every_name_the_code_uses_is_in_the_vocabulary_and_every_entry_is_used():
    used = names_used_by_models()
    assert used <= set(dims.NAMES), used - set(dims.NAMES)
    letters = einsum_letters()
    assert letters <= KNOWN, f"einsum letters outside the vocabulary: {letters - KNOWN}"
    suffixes = suffix_letters()
    unused = {n for n in dims.NAMES if n not in used and dims.LETTERS[n] not in letters
              and dims.LETTERS[n] not in suffixes}
    assert not unused, f"vocabulary entries no code uses: {unused}"


def test_every_variable_suffix_letter_is_in_the_vocabulary():
    outside = {c: sorted(names)[:3] for c, names in suffix_letters().items() if c not in KNOWN}
    assert not outside, f"suffix letters outside the vocabulary (add or rename): {outside}"


def test_the_suffix_check_sees_suffixes():
    found = suffix_letters()
    assert {"B", "L", "D", "E", "W", "A"} <= set(found)
    assert not SUFFIX.search("NEG_INF = -1e9; SEQ_LEN")
    assert SUFFIX.search("x_BLD = 1").group(1) == "BLD"


def test_every_rule_in_a_shipped_layout_is_used_by_some_model():
    used = names_used_by_models()
    for preset in L.presets().values():
        rules = L.parse_layout(preset.layout, tuple(L.parse_mesh(preset.mesh, 8).axes))
        assert set(rules) <= used, f"{preset.name}: rules for unused dims {set(rules) - used}"


def test_letters_are_unique():
    assert len(set(dims.LETTERS.values())) == len(dims.LETTERS)
