"""vltool: what language supervision contributes to CLIP-style models, as composable commands."""

__version__ = "0.1.0"
