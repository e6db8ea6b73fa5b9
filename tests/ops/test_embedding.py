"""GPU parity of the embedding lookup."""

import pytest
import torch

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,hidden,ids_shape", [(1000, 1024, (2, 7)), (517, 3000, (1, 1))])
def test_embedding(vocab, hidden, ids_shape, dtype, gen, poison_empty):
    from tilegym.ops.embedding import embedding

    w = torch.randn(vocab, hidden, device="cuda", generator=gen).to(dtype)
    ids = torch.randint(0, vocab, ids_shape, device="cuda", generator=gen)
    out = embedding(ids, w)
    assert out.shape == (*ids_shape, hidden)
    assert torch.equal(out, torch.nn.functional.embedding(ids, w))
