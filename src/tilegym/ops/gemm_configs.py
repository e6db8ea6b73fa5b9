"""Tile configuration per GEMM shape for `tilegym.ops.gemm` (pure logic, no GPU).

A configuration is chosen from a small static table (`gemm_tiles.json`) measured on an H200
by `benchmarks/ops/bench_gemm.py --sweep` for the projection shapes of the supported models
(keyed by M bucket, N, K and whether the gate-up-SiLU epilogue is fused), with the tiles that
won most often there for every other shape.

Split-K is never chosen automatically. In the H200 sweep no split-K config beat the best
unsplit one at any decode shape of qwen3/llama (M = 1..16), and some split-K configs (tn=128
with tk=256, or tn=128 in the fused gate-up kernel) returned wrong results there: the
last-CTA reduction through the workspace is not reliably ordered for every tile shape. The
kernels keep the split-K path for explicit `TileConfig(split=...)` experiments only.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

DECODE_MAX_M = 16
SMALL_MAX_M = 128
MAX_SPLIT = 16


@dataclass(frozen=True)
class TileConfig:
    """Tile sizes (compile-time), load variant and split-K factor for one GEMM launch.

    `split > 1` is experimental (see the module docstring); the table and defaults use 1.
    """

    tm: int
    tn: int
    tk: int
    split: int = 1
    group_m: int = 8
    latency: int = 0  # ct.load latency hint 1..10; 0 lets the compiler infer it
    transpose_tile: bool = True  # W tile loaded K-contiguous then transposed (else order view)

    def __post_init__(self) -> None:
        for name in ("tm", "tn", "tk"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name}={value} must be a power of two >= 16")
        if not 1 <= self.split <= MAX_SPLIT:
            raise ValueError(f"split={self.split} must be in [1, {MAX_SPLIT}]")
        if not 0 <= self.latency <= 10:
            raise ValueError(f"latency={self.latency} must be in [0, 10]")


def m_bucket(m: int) -> str:
    """Bucket of the token count: 'decode' (M <= 16), 'small' (M <= 128) or 'large'."""
    if m < 1:
        raise ValueError(f"M={m} must be >= 1")
    if m <= DECODE_MAX_M:
        return "decode"
    if m <= SMALL_MAX_M:
        return "small"
    return "large"


def default_config(bucket: str, gated: bool) -> TileConfig:
    """The tiles that won most rows of the H200 sweep, for shapes outside the table."""
    if bucket == "decode":
        return TileConfig(16, 64, 128, transpose_tile=not gated)
    if bucket == "small":
        return TileConfig(64, 64 if gated else 128, 64)
    if gated:
        return TileConfig(128, 64, 64, transpose_tile=False)
    return TileConfig(128, 128, 64)


#: the shipped tile table; TILEGYM_GEMM_TILES names another one (a sweep's output, to verify it)
TILE_TABLE = Path(
    os.environ.get("TILEGYM_GEMM_TILES") or Path(__file__).with_name("gemm_tiles.json")
)


def parse_table(doc: dict) -> dict[tuple[str, int, int, bool], TileConfig]:
    """`{"bucket|N|K|gated": [tm, tn, tk, split, latency, transpose_tile]}` -> {key: cfg}."""
    table = {}
    for key, vals in doc.items():
        bucket, n, k, gated = key.split("|")
        if bucket not in ("decode", "small", "large") or gated not in ("True", "False"):
            raise ValueError(f"bad tile-table key {key!r}")
        table[(bucket, int(n), int(k), gated == "True")] = TileConfig(*vals[:4], 8, *vals[4:])
    return table


def _load_table() -> dict[tuple[str, int, int, bool], TileConfig]:
    if not TILE_TABLE.exists():
        return {}
    return parse_table(json.loads(TILE_TABLE.read_text()))


#: measured on an H200 by `benchmarks/ops/bench_gemm.py --sweep` (its --tuned-out file);
#: N is the output width (for gated: the intermediate size I; the weight holds 2I rows).
TUNED: dict[tuple[str, int, int, bool], TileConfig] = _load_table()


@functools.lru_cache(maxsize=4096)
def choose_config(m: int, n: int, k: int, *, gated: bool = False) -> TileConfig:
    """Tile configuration for `[M, K] @ [N, K]^T` (N = I for the fused gate-up kernel)."""
    if min(n, k) < 1:
        raise ValueError(f"N={n} and K={k} must be >= 1")
    bucket = m_bucket(m)
    return TUNED.get((bucket, n, k, gated)) or default_config(bucket, gated)


def candidate_configs(m: int, n: int, k: int, *, gated: bool = False) -> list[TileConfig]:
    """Configurations the benchmark's sweep tries for one shape (the current choice first)."""
    bucket = m_bucket(m)
    latencies = (0,)
    if bucket == "decode":
        shapes = [(16, 64, 128), (16, 64, 256), (16, 128, 128), (16, 128, 256)]
        latencies = (0, 10)
    elif bucket == "small":
        shapes = [(64, 64, 64), (64, 128, 64), (128, 128, 64)]
    else:
        shapes = [(128, 256, 64), (128, 128, 64), (256, 128, 64), (128, 128, 128)]
        shapes += [(128, 64, 64), (64, 128, 64)]
        if gated:
            shapes = [(128, 128, 64), (128, 64, 64), (64, 128, 64), (128, 64, 128), (64, 64, 64)]
    out = [choose_config(m, n, k, gated=gated)]
    for tm, tn, tk in shapes:
        variants = [(lat, True) for lat in latencies] + [(0, False)]
        for lat, trans in variants:
            cfg = TileConfig(tm, tn, tk, latency=lat, transpose_tile=trans)
            if cfg not in out:
                out.append(cfg)
    return out
