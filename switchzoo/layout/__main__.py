"""python -m switchzoo.layout: the layout inspector's command line (switchzoo/inspector.py)."""
import sys

from switchzoo import inspector

sys.exit(inspector.main())
