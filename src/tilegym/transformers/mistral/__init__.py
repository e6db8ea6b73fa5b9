"""Mistral (mistralai/Mistral-7B-v0.3 architecture): the family description."""
