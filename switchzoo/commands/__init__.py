"""The command lines: ``train`` and ``eval`` (each defines its own absl flags, so each is its own
module), ``cli`` (what they share) and ``entry`` (their entry points). A clone runs them as
``python train.py`` / ``python eval.py``; an installed package as ``switchzoo-train`` /
``switchzoo-eval``. They sit above the library: no library module imports this package."""
