"""Phi-3 (microsoft/Phi-3.5-mini-instruct architecture): the family description."""
