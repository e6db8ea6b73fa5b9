"""Tile configuration per GEMM shape for `tilegym.ops.gemm` (pure logic, no GPU).

A configuration is chosen from a small static table (`gemm_tiles.json`) measured on an H200
for the projection shapes of the supported models (keyed by M bucket, N, K and whether the
gate-up-SiLU epilogue is fused), with the tiles that won most often there for every other
shape. Candidates come from `candidate_configs`; `benchmarks/ops/bench_gemm.py --sweep` times
them alone, `benchmarks/ops/bench_gemm_in_model.py --candidates` inside a patched model's
generate(), which decided the table where the two disagreed (small/medium prefill keys, and
the one-row and large keys it re-checked).

Decode shapes (M <= 16) have few output tiles (N / tn), often fewer than the GPU's 132 SMs.
Their winners are swapped-operand tiles (`TileConfig.swap`: W's rows on the mma's M side,
which compiles to Hopper's warpgroup mma at tn = 64/128 where the unswapped 16-row tile gets
mma.sync), unsplit; M = 8 and M = 16 are tuned apart (buckets "decode" and "decode16") so the
tile's token width can follow M. The sweep still tries split-K with both reductions
(`reduce`: "cta" = last split of a tile sums in the same launch, "pdl" = dependent reduction
kernel) and keeps whichever config measured fastest with a correct result.
One row (M = 1, bucket "single") is a latency-bound stream of W, where the GEMV kernel (plain
16-byte loads, multiply-adds, no TMA or mma; `TileConfig.gemv`) won most projections.
Prefill of short prompts or batches (M = 17-128 "small", 129-1024 "medium") gets smaller
tiles than the large bucket's: at M <= 128 swapped tiles with 32 token columns won most keys.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

DECODE_MAX_M = 16
#: decode token counts up to this fit one swapped tile's token columns at tm = 8 (HGMMA n = 8)
DECODE8_MAX_M = 8
SMALL_MAX_M = 128
#: batch x short-prompt prefill (M = 256-512 in a batch-8/16 generate) gets its own tiles: the
#: "large" ones, tuned at M = 2048, leave most SMs idle there (M = 256, N = 1024 at 128x128: 16
#: tiles) and ran at 47-99% of cuBLAS inside generate()
#: (docs/results/h200-2026-12-01/ops/gemm_in_model_before.txt)
MEDIUM_MAX_M = 1024
MAX_SPLIT = 16
SPLIT_REDUCTIONS = ("cta", "pdl")
#: the largest blocks-per-SM hint: at 8 the compiler caps a 128-thread block at 64 registers
#: (`.maxnreg 64`), which the one-row GEMV tiles of 8192 W elements fit without spills
MAX_OCCUPANCY = 16
#: SMs of the H200 the table is tuned for: split-K aims to put about one block on each
TARGET_SMS = 132


@dataclass(frozen=True)
class TileConfig:
    """Tile sizes (compile-time), load variant, split-K factor and reduction of one launch."""

    tm: int
    tn: int
    tk: int
    split: int = 1
    group_m: int = 8
    latency: int = 0  # ct.load latency hint 1..10; 0 lets the compiler infer it
    transpose_tile: bool = True  # W tile loaded K-contiguous then transposed (else order view)
    reduce: str = "cta"  # how split-K partials are summed (SPLIT_REDUCTIONS); unused at split 1
    ctas: int = 0  # CTAs per cluster (num_ctas hint; 0 = the compiler's choice)
    occupancy: int = 0  # blocks per SM hint (0 = the compiler's choice; caps registers)
    persistent: bool = False  # linear/residual only: one wave of blocks looping over tiles
    gemv: bool = False  # plain loads and multiply-adds, no TMA, no mma (few rows)
    swap: bool = False  # mma operands swapped: W rows on the mma's M side (decode, gemm.py)
    stagger: bool = False  # K order rotated per N tile (gemm._k_tile; not with gemv)

    def __post_init__(self) -> None:
        for name in ("tm", "tn", "tk"):
            value = getattr(self, name)
            low = 1 if self.gemv and name != "tk" else 8 if self.swap and name == "tm" else 16
            if value < low or value & (value - 1):
                raise ValueError(f"{name}={value} must be a power of two >= {low}")
        if self.gemv and (
            self.split > 1 or self.persistent or self.tm > 16 or self.swap or self.stagger
        ):
            raise ValueError(
                "a gemv config has tm <= 16, no split, persistent loop, swap or stagger"
            )
        if not 1 <= self.split <= MAX_SPLIT:
            raise ValueError(f"split={self.split} must be in [1, {MAX_SPLIT}]")
        if not 0 <= self.latency <= 10:
            raise ValueError(f"latency={self.latency} must be in [0, 10]")
        if self.ctas not in (0, 1, 2, 4) or not 0 <= self.occupancy <= MAX_OCCUPANCY:
            raise ValueError(f"ctas={self.ctas} / occupancy={self.occupancy} out of range")
        if self.swap and self.split > 1 and self.reduce == "cta":
            # the last-CTA sum of swapped tiles read stale partials (H200, session 15: 20 of
            # ~560 swapped cta configs of one sweep, none of two others); the PDL sum did not
            raise ValueError("swapped tiles split K only with reduce='pdl'")
        if self.persistent and self.split > 1:
            raise ValueError("a persistent config cannot split K")
        if self.reduce not in SPLIT_REDUCTIONS:
            raise ValueError(f"reduce={self.reduce!r} must be one of {SPLIT_REDUCTIONS}")


def config_name(c: TileConfig) -> str:
    """Short name of a config in benchmark tables, e.g. ``swap-8x64x256/s4-pdlO2S``: tiles, split
    and reduction, latency, ``o`` for the order-view W tile, cluster/occupancy hints, ``P``
    persistent, ``S`` staggered."""
    lat = f"L{c.latency}" if c.latency else ""
    red = f"-{c.reduce}" if c.split > 1 else ""
    hints = (f"c{c.ctas}" if c.ctas else "") + (f"O{c.occupancy}" if c.occupancy else "")
    hints += ("P" if c.persistent else "") + ("S" if c.stagger else "")
    kind = "gemv-" if c.gemv else "swap-" if c.swap else ""
    return (
        f"{kind}{c.tm}x{c.tn}x{c.tk}/s{c.split}{red}{lat}{'' if c.transpose_tile else 'o'}{hints}"
    )


BUCKETS = ("single", "decode", "decode16", "small", "medium", "large")
DECODE_BUCKETS = ("single", "decode", "decode16")
#: buckets between decode and the large prefill tiles: few output tiles at the large shapes
MID_BUCKETS = ("small", "medium")


def m_bucket(m: int) -> str:
    """Bucket of the token count: 'single' (M = 1: one sequence decoding), 'decode'
    (M <= 8), 'decode16' (M <= 16), 'small' (M <= 128), 'medium' (M <= 1024) or 'large'.

    M = 8 and M = 16 are tuned apart because the best swapped tile's token width follows M:
    at M = 16 an 8-row tile runs two blocks per W tile (a second wave on wide N: 77-86% of
    cuBLAS at N = 16384), at M = 8 a 16-row tile pads X (llama packed gate_up: 96% vs 101%,
    docs/results/h200-2026-11-30/ops/gemm_gate_up_probe.txt)."""
    if m < 1:
        raise ValueError(f"M={m} must be >= 1")
    if m == 1:
        return "single"
    if m <= DECODE8_MAX_M:
        return "decode"
    if m <= DECODE_MAX_M:
        return "decode16"
    if m <= SMALL_MAX_M:
        return "small"
    if m <= MEDIUM_MAX_M:
        return "medium"
    return "large"


def default_config(bucket: str, gated: bool) -> TileConfig:
    """The tiles that won most rows of the H200 sweep, for shapes outside the table."""
    if bucket == "single" and not gated:
        return TileConfig(1, 4, 1024, gemv=True)
    if bucket in DECODE_BUCKETS:
        return TileConfig(8, 64, 256 if gated else 512, swap=True)
    if bucket == "small":
        return TileConfig(32, 64, 128 if gated else 256, swap=True)
    if bucket == "medium":
        return TileConfig(64, 128, 64)
    if gated:
        return TileConfig(128, 64, 64, transpose_tile=False)
    return TileConfig(128, 128, 64, occupancy=1, persistent=True)


#: the shipped tile table; TILEGYM_GEMM_TILES names another one (a sweep's output, to verify it)
TILE_TABLE = Path(
    os.environ.get("TILEGYM_GEMM_TILES") or Path(__file__).with_name("gemm_tiles.json")
)


#: a table entry's fields, in order: TileConfig's without group_m (always its default 8)
_ENTRY_FIELDS = [f for f in fields(TileConfig) if f.name != "group_m"]
#: an entry always spells these out: tm, tn, tk, split, latency, transpose_tile
_ENTRY_MIN = 6


def table_entry(cfg: TileConfig) -> list:
    """The tile-table list of ``cfg`` (what `parse_table` reads back): the fields in order,
    trailing ones at their defaults left off."""
    vals = [getattr(cfg, f.name) for f in _ENTRY_FIELDS]
    while len(vals) > _ENTRY_MIN and vals[-1] == _ENTRY_FIELDS[len(vals) - 1].default:
        vals.pop()
    return vals


def parse_table(doc: dict) -> dict[tuple[str, int, int, bool], TileConfig]:
    """`{"bucket|N|K|gated": [tm, tn, tk, split, latency, transpose_tile(, reduce, ctas,
    occupancy, persistent, gemv, swap, stagger)]}` -> {key: cfg}."""
    table = {}
    for key, vals in doc.items():
        bucket, n, k, gated = key.split("|")
        if bucket not in BUCKETS or gated not in ("True", "False"):
            raise ValueError(f"bad tile-table key {key!r}")
        if len(vals) > len(_ENTRY_FIELDS):
            raise ValueError(
                f"tile-table entry {key!r} has {len(vals)} fields, at most {len(_ENTRY_FIELDS)}"
            )
        names = [f.name for f in _ENTRY_FIELDS[: len(vals)]]
        cfg = TileConfig(**dict(zip(names, vals, strict=True)))
        table[(bucket, int(n), int(k), gated == "True")] = cfg
    return table


class TileTableMissing(SystemExit):
    """TILEGYM_GEMM_TILES names no file: the process stops with one ``error:`` line and no
    traceback (a misset environment, found at import, that no caller could recover from)."""


def table_doc() -> dict[str, list]:
    """The tile table's JSON document as stored (empty when the shipped file is absent). A
    TILEGYM_GEMM_TILES that names no file is an error, not an empty table: run that way, a
    "tuned" table's end-to-end check measured every GEMM at the default configs (H100, 12-06)."""
    if TILE_TABLE.exists():
        return json.loads(TILE_TABLE.read_text())
    if os.environ.get("TILEGYM_GEMM_TILES"):
        raise TileTableMissing(f"error: TILEGYM_GEMM_TILES={TILE_TABLE}: no such tile table")
    return {}


def table_text(doc: dict[str, list]) -> str:
    """A tile table as `gemm_tiles.json` stores it: one entry per line, so a re-tune's diff
    shows the keys whose config changed."""
    lines = [f" {json.dumps(key)}: {json.dumps(vals)}" for key, vals in doc.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _load_table() -> dict[tuple[str, int, int, bool], TileConfig]:
    return parse_table(table_doc())


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


def split_factors(n: int, k: int, tn: int, tk: int, min_share: int = 2) -> list[int]:
    """Split-K factors worth trying for a decode shape: enough splits that the output tiles
    times the splits cover about one wave of TARGET_SMS blocks (and twice that), capped so
    each split keeps at least `min_share` K tiles; none when the tiles alone fill the GPU."""
    tiles = -(-n // tn)
    k_tiles = -(-k // tk)
    top = min(MAX_SPLIT, k_tiles // min_share)
    if tiles >= TARGET_SMS or top < 2:
        return []
    wanted = {-(-TARGET_SMS // tiles), -(-2 * TARGET_SMS // tiles)}
    return sorted({min(s, top) for s in wanted})


#: one-row GEMV tiles with a blocks-per-SM hint that the sm_90 compile fits in its register cap
#: without spills, with PDL or without (ptxas -v: 4 x 2048 at 8 is 55-63 registers; 4 x 1024
#: and 2 x 2048 at 8 spill, at 6 not)
GEMV_OCCUPANCY_TILES = ((4, 2048, 8), (4, 2048, 6), (2, 2048, 6), (4, 1024, 6))


def gated_gemv_candidates(k: int) -> list[TileConfig]:
    """One-row tiles of the gate/up GEMV (`gemm.tilegym_gate_up_gemv_kernel`): two weights'
    tiles a K step, reduced every step; with the blocks-per-SM hints of the plain GEMV."""
    kmax = 1 << (k - 1).bit_length()
    out = [TileConfig(1, tn, min(tk, kmax), gemv=True) for tn, tk in ((2, 1024), (4, 1024))]
    # spill-free under the hint's register cap (sm_90 ptxas -v; 4 x 2048 spills at 6 and 8,
    # 2 x 2048 at 8 without PDL)
    for tn, tk, occupancy in ((2, 1024, 8), (2, 2048, 6), (4, 1024, 8), (4, 1024, 6), (1, 4096, 8)):
        out.append(TileConfig(1, tn, min(tk, kmax), occupancy=occupancy, gemv=True))
    return list(dict.fromkeys(out))


def gemv_candidates(m: int, k: int) -> list[TileConfig]:
    """GEMV configs for a decode shape: rows per block up to M (fewer rows re-read W from L2),
    a block's K in one or a few wide plain loads.

    Only M = 1 picks them: at M = 8/16, 8- and 16-row GEMV tiles (8x4x256, 16x2x256, ...) ran
    1.3-10x slower than the mma kernels on the H200 (fp32 multiply-adds without tensor cores;
    docs/results/h200-2026-11-30/ops/gemm_swap_probe.txt)."""
    rows = 1 << (max(1, m) - 1).bit_length()
    kmax = 1 << (k - 1).bit_length()
    out = []
    for tm in sorted({1, min(rows, 4), min(rows, 16)}):
        for tn, tk in ((8, 1024), (16, 512), (4, 2048), (16, 256)):
            if tm * tn * tk <= 16384:
                out.append(TileConfig(tm, tn, min(tk, kmax), gemv=True))
    if rows == 1:  # tiles that keep the products over K steps and reduce once (GEMV_ACC_ELEMS)
        for tn, tk in ((4, 1024), (2, 2048), (8, 512), (1, 4096)):
            for latency in (0, 1):
                out.append(TileConfig(1, tn, min(tk, kmax), latency=latency, gemv=True))
        # more blocks an SM, so more W bytes in flight: the compiler's own choice (about 93
        # registers) leaves 5 blocks of 128 threads an SM; 6 and 8 cap it at 80 and 64
        for tn, tk, occupancy in GEMV_OCCUPANCY_TILES:
            out.append(TileConfig(1, tn, min(tk, kmax), occupancy=occupancy, gemv=True))
    return list(dict.fromkeys(out))


def candidate_configs(m: int, n: int, k: int, *, gated: bool = False) -> list[TileConfig]:
    """Configurations the benchmark's sweep tries for one shape (the current choice first)."""
    bucket = m_bucket(m)
    if bucket in DECODE_BUCKETS:
        more = _decode_candidates(m, n, k, gated)
    elif bucket in MID_BUCKETS:
        more = _mid_candidates(m, n, k, gated)
    else:
        more = _large_candidates(gated)
    return list(dict.fromkeys([choose_config(m, n, k, gated=gated), *more]))


def _large_candidates(gated: bool) -> list[TileConfig]:
    """Large (M > 1024) candidates of `candidate_configs`: the tiles with both W-tile layouts,
    the first two with cluster/occupancy hints and (linear) as a persistent loop.

    No 128x256 output (linear) or 128x128 gate+up pair (gated): their fp32 accumulators spill
    (sm_90 SASS: 659 and 160 local stores); at M = 2048 they ran 14-16x and 3-4x slower than
    the table's tiles on the H200 (docs/results/h200-2026-12-01/ops/gemm_gate_up_prefill.txt)
    and never won a sweep."""
    shapes = [(128, 128, 64), (256, 128, 64), (128, 128, 128), (128, 64, 64), (64, 128, 64)]
    if gated:
        shapes = [(128, 64, 64), (64, 128, 64), (128, 64, 128), (64, 64, 64)]
    out = [TileConfig(tm, tn, tk, transpose_tile=t) for tm, tn, tk in shapes for t in (True, False)]
    for tm, tn, tk in shapes[:2]:
        out += [TileConfig(tm, tn, tk, ctas=c, occupancy=o) for c, o in ((2, 0), (0, 1), (2, 1))]
    if not gated:
        for tm, tn, tk in shapes[:2]:
            out += [TileConfig(tm, tn, tk, occupancy=o, persistent=True) for o in (1, 2)]
    return out


#: unswapped tiles of the small/medium sweep (each with both W-tile layouts)
MID_TILES = ((64, 64, 64), (64, 128, 64), (128, 64, 64), (128, 128, 64), (64, 64, 128))
#: swapped (tn, tk) tiles of the small bucket's sweep (token widths 32 and 64)
MID_SWAP_TILES = ((64, 128), (64, 256), (128, 128))


def _mid_candidates(m: int, n: int, k: int, gated: bool) -> list[TileConfig]:
    """Small/medium (M = 17-1024) candidates of `candidate_configs`: prefill of short prompts
    or batches, where the large prefill tiles leave most SMs idle (M = 256, N = 2048 at
    128x128: 32 tiles on 132 SMs). Smaller tiles; at M <= 128 also swapped tiles (W rows on
    the mma's M side, as at decode) with 32/64 token columns; at medium M the large bucket's
    persistent tile for reference. No split-K: on the H200 it won no small/medium row, alone
    or inside generate(), where the split configs ran at 11-87% of cuBLAS
    (docs/results/h200-2026-12-01/ops/gemm_in_model_tuning.txt)."""
    out: list[TileConfig] = []
    for tm, tn, tk in MID_TILES:
        out += [TileConfig(tm, tn, tk, transpose_tile=t) for t in (True, False)]
    out += [TileConfig(tm, tn, tk, occupancy=2) for tm, tn, tk in MID_TILES[:2]]
    if m <= SMALL_MAX_M:
        for tm in (32, 64):
            out += [TileConfig(tm, tn, tk, swap=True) for tn, tk in MID_SWAP_TILES]
    elif not gated:
        out.append(TileConfig(128, 128, 64, occupancy=1, persistent=True))
    return out


#: swapped (tn, tk) tiles the decode sweep tries; (64, 256) and (128, 128) also at occupancy 2
SWAP_TILES = ((32, 256), (64, 128), (64, 256), (64, 512), (128, 64), (128, 128), (128, 256))


def _decode_candidates(m: int, n: int, k: int, gated: bool) -> list[TileConfig]:
    """Decode (M <= 16) candidates of `candidate_configs`.

    Swapped-operand tiles won every M = 8/16 key of the H200 sweeps since they were added;
    each also with its K order staggered per N tile (`TileConfig.stagger`); the unswapped
    16-row tiles are kept at two shapes, with split-K over both reductions, as
    the measured alternative (and the only users of the last-CTA sum). Token widths: 8 at
    M <= 8, 8 and 16 above. GEMV tiles only at M = 1: at M = 8/16 they ran 1.3-10x slower
    (docs/results/h200-2026-11-30/ops/gemm_swap_probe.txt). The persistent loop only where
    the N tiles make several waves (lm_head: 101-104% of cuBLAS vs 99-100% per-tile,
    docs/results/h200-2026-11-30/ops/gemm_lm_head.txt).
    """
    out: list[TileConfig] = []
    for tm, tn, tk in ((16, 32, 256), (16, 64, 256)):
        out.append(TileConfig(tm, tn, tk))
        for split in split_factors(n, k, tn, tk):
            out += [TileConfig(tm, tn, tk, split=split, reduce=r) for r in SPLIT_REDUCTIONS]
    for tm in (8,) if m <= DECODE8_MAX_M else (8, 16):
        for tn, tk in SWAP_TILES:
            out.append(TileConfig(tm, tn, tk, swap=True))
            out.append(TileConfig(tm, tn, tk, swap=True, stagger=True))
            if (tn, tk) in ((64, 256), (128, 128)):
                out.append(TileConfig(tm, tn, tk, occupancy=2, swap=True))
            if tn != 64:
                continue
            for split in split_factors(n, k, tn, tk, min_share=1):
                waves = -(-split * -(-n // tn) // TARGET_SMS)  # blocks per SM to fit
                occ = min(waves, 4) if waves > 1 else 0
                out.append(TileConfig(tm, tn, tk, split, reduce="pdl", occupancy=occ, swap=True))
    if gated:
        return out + (gated_gemv_candidates(k) if m == 1 else [])
    if m == 1:
        out += gemv_candidates(m, k)
    if -(-n // 128) >= 2 * TARGET_SMS:
        for tn, tk in ((64, 128), (128, 128), (128, 256)):
            for occupancy in (1, 2):
                out.append(TileConfig(16, tn, tk, occupancy=occupancy, persistent=True))
                out.append(TileConfig(16, tn, tk, occupancy=occupancy, persistent=True, swap=True))
    return out
