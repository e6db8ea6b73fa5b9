"""Qwen3-Next (Qwen/Qwen3-Next-80B-A3B's architecture, layer-reduced): cuTile forwards."""
