"""OLMoE (allenai/OLMoE-1B-7B-0924 architecture): cuTile forwards and inventory."""
