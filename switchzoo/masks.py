"""How attention masks: ``Mask``, in the form the fused kernels take best, and ``of_stack``,
a stack's masks decided once for all its layers from the batch's structure."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Mask(NamedTuple):
    """What an attention may not see besides later keys (the stack's causality), in the form the
    fused kernels take best: ``keep_BTS``, a boolean [B, T, S] (packed segments; a decoding
    cache, its causality included), and/or right padding as the valid lengths [B] of the
    queries and keys (one sequence per row, padding after it), or nothing at all. cuDNN masks
    lengths and causality itself; only ``keep_BTS`` becomes part of its bias (JAX adds a
    boolean mask to the bias), so a batch without segments gives it none."""
    keep_BTS: jax.Array | None = None
    q_lengths_B: jax.Array | None = None
    kv_lengths_B: jax.Array | None = None

    @classmethod
    def of(cls, mask) -> "Mask":
        """A Mask, a boolean [B, T, S] (keep_BTS) or None (nothing masked) as a Mask."""
        return mask if isinstance(mask, Mask) else cls(keep_BTS=mask)

    def dense(self, T: int, S: int, causal: bool):
        """The whole mask as one boolean [B or 1, T, S] (None: nothing masked), as the
        reference path and the Pallas kernel take it; ``causal``: keys after the query by
        index masked too."""
        keep = self.keep_BTS
        for lengths_B, axis, n in ((self.q_lengths_B, 2, T), (self.kv_lengths_B, 1, S)):
            if lengths_B is not None:
                valid = jnp.expand_dims(jnp.arange(n)[None] < lengths_B[:, None], axis)
                keep = valid if keep is None else keep & valid
        if causal:
            tril = jnp.tril(jnp.ones((T, S), bool))[None]
            keep = tril if keep is None else keep & tril
        return keep


def of_stack(shape_BT, causal: bool, positions_BT, segments_BT, enc_segments_BS=None,
         cache=None, index=None, lengths_B=None, enc_lengths_B=None):
    """Self- and cross-attention Masks and the key positions (with a cache, its updated
    ``valid``), computed once per stack for all its layers. Decided from the batch's
    structure, statically: lengths where the rows are right-padded sequences, a boolean
    [B, T, S] where they are packed (segments), nothing where neither is given; causality
    is the Attention's (by index), except against a cache (by position, in the mask)."""
    B, T = shape_BT
    # An empty row (evaluation's filler) keeps one key, so no kernel meets a row that
    # sees nothing: its tokens reach no loss and no router.
    lengths_B, enc_lengths_B = (None if n is None else jnp.maximum(n, 1)
                                for n in (lengths_B, enc_lengths_B))
    if cache is not None:
        valid_BS = jax.lax.dynamic_update_slice(cache["valid"], segments_BT != 0, (0, index))
        k_pos_BS = jnp.broadcast_to(jnp.arange(valid_BS.shape[1]), valid_BS.shape)
        keep_BTS = jnp.broadcast_to(valid_BS[:, None, :], (B, T, valid_BS.shape[1]))
        if causal:
            keep_BTS = keep_BTS & (k_pos_BS[:, None, :] <= positions_BT[:, :, None])
        mask, cache = Mask(keep_BTS), {**cache, "valid": valid_BS}
    else:
        k_pos_BS = positions_BT
        if lengths_B is not None:
            mask = Mask(q_lengths_B=lengths_B, kv_lengths_B=lengths_B)
        elif segments_BT is not None:
            mask = Mask(segments_BT[:, :, None] == segments_BT[:, None, :])
        else:
            mask = Mask()
    if enc_lengths_B is not None and cache is None:
        cross = Mask(q_lengths_B=lengths_B, kv_lengths_B=enc_lengths_B)
    elif enc_segments_BS is not None:
        seg_BT = jnp.ones(shape_BT, jnp.int32) if segments_BT is None else segments_BT
        cross = Mask((seg_BT[:, :, None] == enc_segments_BS[:, None, :])
                     & (enc_segments_BS[:, None, :] != 0))
    else:
        cross = Mask()
    return mask, cross, k_pos_BS, cache
