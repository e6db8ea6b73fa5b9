"""Model shapes the op benchmarks use: Qwen3-0.6B and Llama-3.2-1B at decode and prefill."""

MODELS = {
    # hidden, intermediate, q heads, kv heads, head dim, vocab
    "qwen3": dict(hidden=1024, inter=3072, hq=16, hk=8, d=128, vocab=151936),
    "llama": dict(hidden=2048, inter=8192, hq=32, hk=8, d=64, vocab=128256),
}

#: tokens per forward: decode at batch 1 and 8, prefill of 2048 tokens
TOKENS = (1, 8, 2048)

#: attention heads of every family's preset (q heads, kv heads, head dim): RoPE and attention
#: tables for the other families (``--models``); the two above keep their full shapes
HEADS = {
    **{key: {h: m[h] for h in ("hq", "hk", "d")} for key, m in MODELS.items()},
    "mistral": dict(hq=32, hk=8, d=128),
    "qwen2": dict(hq=12, hk=2, d=128),
    "phi3": dict(hq=32, hk=32, d=96),
    "gemma3": dict(hq=4, hk=1, d=256),
    "olmo2": dict(hq=16, hk=16, d=128),
}
