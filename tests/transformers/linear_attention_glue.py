"""What the CPU glue runs for the Definitions of the Qwen3.5 / Qwen3-Next mixer (the gated delta
rule, its causal conv1d, the gated RMSNorm and the attention output gate), keyed by Definition
stem: the two families' inventory tests check their references against these."""

from __future__ import annotations

from tilegym.ops import library as lib

MIXER_GLUE = {
    "causal_conv1d": lambda x, w: lib.causal_conv1d(x, w, None, None, w.shape[1]),
    "causal_conv1d_update": lambda x, s, w: (lib.causal_conv1d_update(x, s, w, None), s),
    "gated_delta_chunk": lambda q, k, v, a, b, A, dt: lib.gated_delta_chunk(
        q, k, v, a, b, A, dt, None
    ),
    "gated_delta_recurrent": lambda q, k, v, a, b, A, dt, s: (
        lib.gated_delta_recurrent(q, k, v, a, b, A, dt, s),
        s,
    ),
    "rms_norm_gated": lambda x, z, w: lib.rms_norm_gated(x, z, w, 1e-6),
    "attn_output_gate": lambda x, q: lib.sigmoid_gate(x, q[..., q.shape[-1] // 2 :]),
}
