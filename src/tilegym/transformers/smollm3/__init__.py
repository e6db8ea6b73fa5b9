"""SmolLM3 (HuggingFaceTB/SmolLM3-3B architecture): cuTile forwards, model-local kernels,
inventory."""
