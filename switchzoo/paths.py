"""Parameter paths as strings, ``decoder/layers/1/ffn/wi`` (jax.tree_util.keystr's simple form):
what every module keys parameters by. A leaf below ``optim`` and ``state`` (which re-exports
path_name, as its callers use it)."""
from __future__ import annotations

import jax


def path_name(path) -> str:
    """'decoder/layers/1/ffn/wi' for a jax key path (or a tuple of plain keys)."""
    if all(isinstance(k, (str, int)) for k in path):
        return "/".join(map(str, path))
    return jax.tree_util.keystr(tuple(path), simple=True, separator="/")
