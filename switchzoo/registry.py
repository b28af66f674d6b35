"""Catalogues kept as data files in the repository (models/*.py, configs/tables/*.py): each
folder is read once per process, and names are looked up with a suggestion for a near miss."""
from __future__ import annotations

import difflib
import functools
import importlib.util
import pathlib


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
def modules(directory: pathlib.Path, first: str = "") -> tuple:
    """((path, module), ...) of the folder's *.py files (``first`` leading, then by name)."""
    out = []
    for path in sorted(directory.glob("*.py"), key=lambda p: (p.stem != first, p.stem)):
        if path.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(
            f"switchzoo_{directory.name}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out.append((path, module))
    return tuple(out)
