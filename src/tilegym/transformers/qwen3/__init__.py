"""Qwen3 (Qwen/Qwen3-0.6B architecture): cuTile forwards, model-local kernels and inventory."""
