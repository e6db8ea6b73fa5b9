"""Qwen3-MoE (Qwen/Qwen3-30B-A3B architecture): cuTile forwards, local kernels and inventory."""
