"""Key rotation (``runselvedge rotate-keys``): stored values under the first key.

The work is the store's (:mod:`selvedge_django.storage.rotation`): bounded batches,
each one transaction, resumable after an interruption.
"""

from __future__ import annotations

from collections.abc import Callable

from ..storage.rotation import RotationCounts
from .base import client_store

__all__ = ["RotationCounts", "rotate_keys"]


def rotate_keys(
    batch_size: int = 500, progress: Callable[[RotationCounts], None] | None = None
) -> RotationCounts:
    """Re-encrypt every stored value whose envelope names another key than the first
    of ``PAYLOAD_KEYS``; return the counts (``changed``, ``undecodable``).

    Raises ValueError when no ``PAYLOAD_CODEC`` is configured or ``batch_size`` is
    not a positive integer. Run it again after an interruption: what is done is
    skipped without a write.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError("batch_size must be a positive integer")
    store = client_store()
    if store.codec.payload is None:
        raise ValueError("rotate-keys needs SELVEDGE['PAYLOAD_CODEC'] (and PAYLOAD_KEYS)")
    return store.rotation.run(batch_size, progress)
