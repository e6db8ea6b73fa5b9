"""Gemma 3 (google/gemma-3-1b-it text architecture): cuTile forwards, model-local kernels and
inventory."""
