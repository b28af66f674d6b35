"""The layout planner, above the run's set-up: which mesh and layout fit a model on some
hardware. ``candidates`` enumerates meshes and layouts, ``estimate`` prices memory and time
analytically, ``search`` compiles the survivors and ranks them (``hlo`` reads the compiled
program, ``hardware`` prices it), ``advice`` says what would fit when nothing does, and
``command`` is ``python -m switchzoo.layout search``. The layout core it plans for (layout
strings -> shardings on a named mesh) is switchzoo.layout, floors below."""
