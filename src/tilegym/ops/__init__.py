"""Reusable cuTile kernels, each with a plain PyTorch reference beside it.

Modules are imported on demand (``from tilegym.ops.rms_norm import rms_norm``) so that one
module's toolchain problem never hides another's kernels:

- ``rms_norm``: RMSNorm and fused residual-add + RMSNorm (transformers numerics)
- ``rope``: rotary embedding for q and k in one launch; Qwen3 q/k-norm fused with RoPE
- ``silu_and_mul``: SwiGLU activation over separate or concatenated gate/up
- ``gelu_and_mul``: GeGLU (tanh GELU) activation, likewise (Gemma 3)
- ``embedding``: token embedding lookup
- ``gemm``, ``attention``, ``kv_cache``: GEMM and attention kernels (their own modules)
- ``gated_delta``, ``causal_conv1d``, ``rms_norm_gated``: Qwen3.5's linear attention (gated
  delta rule: chunked prefill and recurrent decode; the short conv with its cache state; the
  gated RMSNorm)
- ``attention_sinks``, ``moe_bias``: attention with sinks and biased, clamped experts (gpt-oss)
- ``testing``: relative-error parity checks used by the GPU tests

Every kernel module defines ``aot_signatures()`` for the AOT compile gate.
"""

SMALL_OP_MODULES = ("rms_norm", "rope", "silu_and_mul", "gelu_and_mul", "embedding")
