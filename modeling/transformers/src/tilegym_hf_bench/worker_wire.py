"""The wire between the trusted measuring process and the model worker: one JSON object a line
over a pair of pipes, and tensors in safetensors files in the worker's scratch folder.

Nothing the worker sends is unpickled or evaluated: JSON and safetensors are data formats, so a
hostile worker can lie in what it returns but cannot run code in the process that judges it.
Torch-free except ``read_tensors``.
"""

from __future__ import annotations

import json
import os
import select
import time
from pathlib import Path
from typing import Any

#: The longest line either side accepts (a prompt of 8 x 4096 ids is well under this).
MAX_LINE_BYTES = 16 * 1024 * 1024


class WireError(Exception):
    """The other side closed the wire, sent something that is not a message, or took too long."""


def send(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message, allow_nan=False, separators=(",", ":")) + "\n").encode()
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class Reader:
    """Reads messages from one pipe, with a deadline per message."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buffer = b""

    def recv(self, timeout_s: float | None = None) -> dict[str, Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE_BYTES:
                raise WireError(f"a message longer than {MAX_LINE_BYTES} bytes")
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _, _ = select.select([self.fd], [], [], wait)
            if not ready:
                raise WireError(f"no answer within {timeout_s:g} s")
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise WireError("the other side closed the wire")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise WireError(f"not a JSON message: {exc}") from None
        if not isinstance(message, dict):
            raise WireError("a message must be a JSON object")
        return message


def tensor_file(scratch: Path, name: str) -> Path:
    """Where the worker leaves tensor file ``name``: inside its scratch folder, by a plain name,
    so a reply cannot point the judge at any other file."""
    if not name.replace("-", "").replace("_", "").isalnum():
        raise WireError(f"bad tensor file name {name!r}")
    return scratch / f"{name}.safetensors"


def read_tensors(scratch: Path, name: str) -> dict:
    """The tensors of one reply file (safetensors: data only), deleted once read."""
    from safetensors.torch import load_file

    path = tensor_file(scratch, name)
    try:
        return load_file(str(path))
    except (OSError, ValueError, RuntimeError) as exc:
        raise WireError(f"{path.name}: not a readable safetensors file: {exc}") from None
    finally:
        path.unlink(missing_ok=True)
