"""``_common.stream()`` is the stream ``torch.cuda.current_stream()`` gives, also after a switch."""

import pytest
import torch

from tilegym.ops import _common
from tilegym.ops.rms_norm import rms_norm, rms_norm_reference

pytestmark = pytest.mark.gpu


def test_stream_follows_the_current_stream():
    assert _common.stream() == torch.cuda.current_stream()
    assert _common.stream(torch.device("cuda", torch.cuda.current_device())) == (
        torch.cuda.current_stream()
    )
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert _common.stream() == side
        assert _common.stream().cuda_stream == side.cuda_stream
    assert _common.stream() == torch.cuda.current_stream()


def test_kernels_launch_on_a_side_stream_in_order(gen):
    """A kernel launched under ``torch.cuda.stream(side)`` runs on ``side``, ordered after the
    PyTorch op that produced its input there."""
    side = torch.cuda.Stream()
    w = torch.randn(1000, generator=gen, device="cuda").bfloat16()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x = torch.randn(257, 1000, generator=gen, device="cuda").bfloat16() * 3.0
        out = rms_norm(x, w, 1e-6)
    side.synchronize()
    ref = rms_norm_reference(x.float(), w.float(), 1e-6)
    assert (out.float() - ref).norm() / ref.norm() < 1e-2
