"""The papers' tables (data): each module holds ``TABLE`` and optionally ``MINI``; installed as
``switchzoo.configs.tables`` and read by switchzoo.tables."""
