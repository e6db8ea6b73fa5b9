"""Mixtral (mistralai/Mixtral-8x7B-v0.1 architecture): cuTile forwards and inventory."""
