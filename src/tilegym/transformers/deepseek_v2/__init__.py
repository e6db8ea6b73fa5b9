"""DeepSeek-V2 (deepseek-ai/DeepSeek-V2-Lite architecture): cuTile forwards and inventory."""
