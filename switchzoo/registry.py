"""Catalogues shipped as data inside the package (switchzoo.models, switchzoo.configs.tables):
each is imported once per process, and names are looked up with a suggestion for a near miss;
run configs (switchzoo.configs) are found by path (config_path)."""
from __future__ import annotations

import difflib
import functools
import importlib
import importlib.resources
import pathlib
import pkgutil
import types


def suggest(word: str, options) -> str:
    """' (did you mean 'x'?)' for the closest option, or ''."""
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def lookup(entries: dict, name: str, what: str):
    """entries[name], or a one-line error naming the known names."""
    if name not in entries:
        raise ValueError(f"unknown {what} '{name}'{suggest(name, entries)}; known: "
                         f"{', '.join(entries)}")
    return entries[name]


@functools.cache
def modules(package: str, first: str = "") -> tuple[types.ModuleType, ...]:
    """The public submodules of ``package`` (``first`` leading, then by name), imported."""
    found = pkgutil.iter_modules(importlib.import_module(package).__path__)
    stems = sorted((m.name for m in found if not m.ispkg and not m.name.startswith("_")),
                   key=lambda stem: (stem != first, stem))
    return tuple(importlib.import_module(f"{package}.{stem}") for stem in stems)


def stem(module: types.ModuleType) -> str:
    """A catalogue module's own name: 'switch' for switchzoo.models.switch."""
    return module.__name__.rpartition(".")[2]


def config_path(path: str) -> str:
    """``configs/NAME.py`` as given when it exists here (a clone), else the copy installed in
    the package (switchzoo.configs), else as given (and the loader's error names it)."""
    if pathlib.Path(path).exists():
        return path
    parent, name = pathlib.Path(path).parent.name, pathlib.Path(path).name
    if parent in ("configs", "") and name.endswith(".py"):
        packaged = importlib.resources.files("switchzoo.configs") / name
        if packaged.is_file():
            return str(packaged)
    return path
