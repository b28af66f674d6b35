"""python -m switchzoo.layout: the layout inspector (switchzoo/inspector.py); with ``search``
first, the layout search (switchzoo/planner/search.py)."""
import sys

if sys.argv[1:2] == ["search"]:
    from switchzoo.planner import command
    sys.exit(command.main())

from switchzoo import inspector

sys.exit(inspector.main())
