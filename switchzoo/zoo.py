"""The model zoo: name -> ModelConfig, read from the catalogue in models/ (data, not code)."""
from __future__ import annotations

import difflib
import importlib.util
import pathlib

from switchzoo.config import ModelConfig, MoeConfig

CATALOGUE_DIR = pathlib.Path(__file__).resolve().parent.parent / "models"


def _entries() -> dict[str, dict]:
    entries: dict[str, dict] = {}
    for path in sorted(CATALOGUE_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"switchzoo_models_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, entry in module.MODELS.items():
            if name in entries:
                raise ValueError(f"model '{name}' is defined twice in {CATALOGUE_DIR}; rename one")
            entries[name] = entry
    return entries


def names() -> list[str]:
    return list(_entries())


def entry(name: str) -> dict:
    """The catalogue entry: hyper-parameters plus 'source' and published figures."""
    entries = _entries()
    if name not in entries:
        close = difflib.get_close_matches(name, entries, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ValueError(f"unknown model '{name}'{hint}; known models: {', '.join(entries)}")
    return entries[name]


def get(name: str) -> ModelConfig:
    """The ModelConfig of a catalogue entry."""
    hp = {k: v for k, v in entry(name).items() if k not in ("source", "published")}
    moe = hp.pop("moe", None)
    return ModelConfig(**hp, moe=MoeConfig(**moe) if moe is not None else None)
