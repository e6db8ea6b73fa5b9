"""Granite kernel entry points named by the Solution JSON files (thin wrappers over tilegym.ops)."""
