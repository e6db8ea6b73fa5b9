"""OLMo 3 (allenai/Olmo-3-1025-7B architecture): cuTile forwards and inventory."""
