"""Qwen2 (Qwen/Qwen2.5-1.5B architecture): the family description."""
