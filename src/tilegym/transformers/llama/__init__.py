"""Llama (meta-llama/Llama-3.2-1B architecture): cuTile forwards, model-local kernels, inventory."""
