"""gpt-oss (openai/gpt-oss-20b architecture): cuTile forwards and inventory."""
