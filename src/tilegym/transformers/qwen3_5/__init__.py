"""Qwen3.5 (Qwen/Qwen3.5-0.8B's text architecture): cuTile forwards and inventory."""
