"""The PTX a cuTile cubin carries, for tests of instruction order and of register use (CPU only,
no GPU needed).

`export_kernel(..., output_format="cubin")` writes an ELF whose `.nv_debug_ptx_txt` section holds
the PTX text, one line per NUL-separated entry. `global_accesses` follows each global load and
store's address back to the kernel's pointer parameters, so a test can ask which array a load
reads and whether it comes before an instruction such as `griddepcontrol.wait` (in the PTX's
layout order, which is program order in the straight-line code before a loop). `ptxas_usage`
assembles the PTX with the toolchain's ptxas for its registers, spills and shared memory.
"""

from __future__ import annotations

import io
import re
import struct
from typing import NamedTuple

_REG = re.compile(r"%[a-z]+\d+")
_GUARD = re.compile(r"^@!?%p\d+\s+")
_PARAM = re.compile(r"(\w+_param_\d+)")


def elf_sections(blob: bytes) -> dict[str, bytes]:
    """{name: contents} of the sections of a 64-bit little-endian ELF file."""
    if blob[:5] != b"\x7fELF\x02" or blob[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", blob, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", blob, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", blob, shoff + i * entsize) for i in range(count)]
    names_at = headers[names_index][4]
    out = {}
    for name, _type, _flags, _addr, offset, size in headers:
        start = names_at + name
        out[blob[start : blob.index(b"\0", start)].decode()] = blob[offset : offset + size]
    return out


def ptx_lines(kernel, signature, gpu_code: str = "sm_90") -> list[str]:
    """The PTX lines (stripped; blank ones kept, so indices match the section's entries) of
    `kernel` compiled for `signature` into a cubin for `gpu_code`."""
    from cuda.tile.compilation import export_kernel

    buf = io.BytesIO()
    export_kernel(kernel, [signature], buf, output_format="cubin", gpu_code=gpu_code)
    text = elf_sections(buf.getvalue())[".nv_debug_ptx_txt"]
    return [line.decode().strip() for line in text.split(b"\0")]


def entry_body(lines: list[str]) -> range:
    """Indices of the first `.entry` function's body, between its outer braces."""
    entry = next(i for i, line in enumerate(lines) if re.match(r"(\.visible\s+)?\.entry\b", line))
    start = lines.index("{", entry)
    depth = 0
    for i in range(start, len(lines)):
        depth += {"{": 1, "}": -1}.get(lines[i], 0)
        if depth == 0:
            return range(start + 1, i)
    raise ValueError("unterminated .entry body")


def instructions(lines: list[str], prefix: str) -> list[int]:
    """Indices of the entry body's instructions whose opcode starts with `prefix` (any guard
    predicate ignored)."""
    return [i for i in entry_body(lines) if _GUARD.sub("", lines[i]).startswith(prefix)]


class Access(NamedTuple):
    line: int  #: index into the PTX lines
    op: str  #: the opcode, e.g. ld.global.b16
    arrays: frozenset[int]  #: the pointer parameters (0 = the kernel's first array) of its address


def global_accesses(lines: list[str]) -> list[Access]:
    """Every ld/st/atom/red on global memory and every TMA copy (cp.async.bulk...global) in the
    entry body, with the pointer parameters its address derives from: registers followed
    forward through the instructions that compute them; a loaded value never counts as derived
    from its address, and a TMA copy's tensor map is none of them (an empty set)."""
    entry = next(i for i, line in enumerate(lines) if re.match(r"(\.visible\s+)?\.entry\b", line))
    body = entry_body(lines)
    pointers = [
        m.group(1)
        for line in lines[entry : body.start]
        if ".ptr" in line and (m := _PARAM.search(line))
    ]
    origin: dict[str, frozenset[int]] = {}
    out = []
    for i in body:
        line = _GUARD.sub("", lines[i]).rstrip(";")
        if not line or line.startswith(("$", ".", "//")):
            continue
        op, *rest = line.split(None, 1)
        operands = rest[0] if rest else ""
        regs = _REG.findall(operands)
        if op.startswith("ld.param"):
            param = _PARAM.search(operands)
            if param and param.group(1) in pointers:
                origin[regs[0]] = frozenset({pointers.index(param.group(1))})
            continue
        addresses = re.findall(r"\[([^\]]*)\]", operands)
        if op.split(".")[0] in ("ld", "st", "atom", "red", "cp") and ".global" in op and addresses:
            used = frozenset().union(
                *(origin.get(r, ()) for r in _REG.findall(" ".join(addresses)))
            )
            out.append(Access(i, op, used))
            continue
        if regs and not op.startswith(("ld", "st", "bra", "bar", "setp")):
            derived = frozenset().union(*(origin.get(r, ()) for r in regs[1:]))
            if derived:
                origin[regs[0]] = origin.get(regs[0], frozenset()) | derived
    return out


class Usage(NamedTuple):
    registers: int
    spill_stores: int  #: bytes a thread
    spill_loads: int  #: bytes a thread
    shared: int  #: bytes of shared memory a block


def ptxas_usage(lines: list[str], gpu_name: str = "sm_90a") -> Usage:
    """Registers, spills and shared memory of the PTX `lines` as the toolchain's own ptxas (the
    one beside tileiras) assembles them, debug line info, debug sections and the embedded tile
    IR source left out."""
    import subprocess
    import tempfile
    from pathlib import Path

    from cuda.tile._compile import _find_compiler_bin

    ptxas = Path(_find_compiler_bin().path).with_name("ptxas")
    kept = []
    for line in lines:
        if line.startswith(".nv_intermediate_source_section") or (
            line.startswith(".section") and "debug" in line
        ):
            break
        if not line.startswith((".loc\t", ".loc ", ".file")):  # not ".local": a stack depot
            kept.append(line)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "k.ptx")
        src.write_text("\n".join(kept))
        done = subprocess.run(
            [str(ptxas), "--gpu-name", gpu_name, "-v", str(src), "-o", str(src.with_suffix(".o"))],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
    info = done.stderr

    def number(pattern: str, absent: int | None = None) -> int:
        match = re.search(pattern, info)
        if match is None:
            if absent is not None:
                return absent
            raise ValueError(f"ptxas -v printed no {pattern!r}: {info[-300:]}")
        return int(match.group(1))

    return Usage(
        number(r"Used (\d+) registers"),
        number(r"(\d+) bytes spill stores"),
        number(r"(\d+) bytes spill loads"),
        number(r"(\d+) bytes smem", absent=0),  # ptxas leaves it out for a kernel with none
    )
