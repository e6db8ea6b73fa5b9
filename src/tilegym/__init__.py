"""TileGym: cuTile (``cuda.tile``) kernels for Hugging Face transformers models."""

__version__ = "0.1.0"
