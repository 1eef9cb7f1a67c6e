"""The Typer layer: one module per subcommand, each turning options into a config and one library call.

Modules here import only typer, the config dataclasses and the shared options; heavy imports
(torch, datasets, transformers) happen inside the command functions so `vltool --help` is instant.
"""
