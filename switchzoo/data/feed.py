"""Training batches placed on the devices ahead of the step that reads them.

    feed = Feed(ds.train, place, ahead=1)
    host, placed = next(feed)     # this process's numpy rows, and place(rows): the step's input
    feed.get_state()              # the input state after the last batch next() returned

``next`` places the batch ``ahead`` steps after the one it returns. JAX dispatches a step
without waiting for it, so the batch of step n + 1 is placed (an asynchronous host -> device
copy) before the loop blocks on step n's metrics, and is on the devices when step n + 1 is
dispatched. The iterator's own read-ahead (pipeline.TrainIterator's threads) is further
upstream; each batch here keeps the iterator's state after it, so the state of a checkpoint
at step n is the one after batch n whatever has been read or placed since.
"""
from __future__ import annotations

import collections
from typing import Callable


class Feed:
    """(host batch, placed batch) pairs of ``train`` (a TrainIterator), ``ahead`` placed early."""

    def __init__(self, train, place: Callable[[dict], object], ahead: int = 1):
        if ahead < 0:
            raise ValueError(f"ahead={ahead}: batches placed early, 0 for none")
        self._train, self._place, self._ahead = train, place, ahead
        self._pending = collections.deque()        # (host, placed, state after it)
        self._state = train.get_state()

    def __iter__(self) -> "Feed":
        return self

    def __next__(self) -> tuple[dict, object]:
        while len(self._pending) <= self._ahead:
            host = next(self._train)
            self._pending.append((host, self._place(host), self._train.get_state()))
        host, placed, self._state = self._pending.popleft()
        return host, placed

    def get_state(self) -> dict:
        """The train iterator's state after the last batch returned (before any: its state)."""
        return self._state
