"""DeepSeek-V3 (deepseek-ai/DeepSeek-V3 architecture): cuTile forwards."""
