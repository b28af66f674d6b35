"""Run configs (data): ``get_config(arg) -> ConfigDict`` per file; installed as
``switchzoo.configs`` (train.py --config=configs/NAME.py finds them there too)."""
