"""GPU parity of the residual add and the embedding lookup."""

import pytest
import torch

from tilegym.ops import elementwise as ew
from tilegym.ops.testing import assert_close_rel

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1024), (13, 1001), (2, 7, 2048)])
def test_add(shape, dtype, gen, poison_empty):
    from tilegym.ops.elementwise import add

    a = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    b = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    assert_close_rel(add(a, b), a.float() + b.float())


# odd sizes (partial last tile), decode sizes (small-input tiles), several tiles per block
ADD_SHAPES = [(13, 1001), (1, 1024), (8, 2048), (257, 1024), (3, 7, 4099), (2048, 1024)]


@pytest.mark.parametrize("shape", ADD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(ew.VARIANTS))
def test_add_variants(name, shape, gen, poison_empty):
    a = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    out = ew.add(a, b, **ew.VARIANTS[name])
    assert out.shape == a.shape
    # PyTorch rounds the fp32 sum once, like the kernel: bit-identical
    assert torch.equal(out, a + b)
    assert_close_rel(out, a.float() + b.float())


def test_add_non_contiguous(gen, poison_empty):
    a = torch.randn(64, 300, device="cuda", generator=gen).to(torch.bfloat16).t()
    b = torch.randn(300, 64, device="cuda", generator=gen).to(torch.bfloat16)
    out = ew.add(a, b)
    assert out.shape == (300, 64) and torch.equal(out, a + b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,hidden,ids_shape", [(1000, 1024, (2, 7)), (517, 3000, (1, 1))])
def test_embedding(vocab, hidden, ids_shape, dtype, gen, poison_empty):
    from tilegym.ops.embedding import embedding

    w = torch.randn(vocab, hidden, device="cuda", generator=gen).to(dtype)
    ids = torch.randint(0, vocab, ids_shape, device="cuda", generator=gen)
    out = embedding(ids, w)
    assert out.shape == (*ids_shape, hidden)
    assert torch.equal(out, torch.nn.functional.embedding(ids, w))
