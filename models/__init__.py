"""The zoo catalogue (data): each module holds ``MODELS = {name: entry}``; installed as
``switchzoo.models`` and read by switchzoo.zoo."""
