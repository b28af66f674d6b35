"""Named layouts (data): one TOML file per preset (layout, mesh, doc); installed as
``switchzoo.layouts`` and read by switchzoo.layout.presets()."""
