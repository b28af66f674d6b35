"""Read at start-up by every Python process the tests start (tests/conftest.py puts this folder
on their PYTHONPATH): the cycle collector's thresholds of the test processes themselves. A tiny
train.py run spends ~0.3 s of its ~5 s of CPU in the collector at the defaults (after
switchzoo.commands.entry's gc.freeze), ~0.1 s at these; the suite starts ~60 such processes."""
import gc

gc.set_threshold(50_000, 50, 100)
