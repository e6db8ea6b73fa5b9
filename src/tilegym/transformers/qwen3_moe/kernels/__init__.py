"""Qwen3-MoE kernel entry points named by the Solution JSON files (wrappers over tilegym.ops)."""
