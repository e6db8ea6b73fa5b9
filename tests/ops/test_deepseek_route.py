"""DeepSeek V2/V3 routers (`tilegym.ops.deepseek_route`) against transformers' own routers.

The upstream router modules run on logits we choose (router weight = identity, hidden = the
logits, exact in fp32). Without ties the routing (each token's weight per expert) is equal;
with ties at the cut (integer logits, tied groups) the chosen experts are a valid top-k of the
allowed ones, the lower index wins, and the chosen scores equal upstream's as multisets.
Group limits are checked to bind: the route differs from the greedy one.
"""

from __future__ import annotations

import pytest
import torch

from tilegym.ops import deepseek_route as dr


def _v2_router(e, k, method, n_group, topk_group, scaling):
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    cfg = DeepseekV2Config(
        hidden_size=e,
        num_attention_heads=1,
        n_routed_experts=e,
        num_experts_per_tok=k,
        topk_method=method,
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=scaling,
    )
    router = DeepseekV2TopkRouter(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.eye(e))
    return router


def _v3_router(e, k, n_group, topk_group, renorm, scaling, bias):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = DeepseekV3Config(
        hidden_size=e,
        num_attention_heads=1,
        n_routed_experts=e,
        num_experts_per_tok=k,
        n_group=n_group,
        topk_group=topk_group,
        norm_topk_prob=renorm,
        routed_scaling_factor=scaling,
    )
    router = DeepseekV3TopkRouter(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.eye(e))
        router.e_score_correction_bias.copy_(bias)
    return router


def _dense(w, ids, e):
    return dr.dense_weights(w.float(), ids, e)


@pytest.mark.parametrize(
    ("e", "k", "method", "n_group", "topk_group", "scaling"),
    [
        (64, 6, "greedy", 1, 1, 1.0),  # DeepSeek-V2-Lite
        (160, 6, "group_limited_greedy", 8, 3, 16.0),  # DeepSeek-V2 (236B)
        (12, 3, "group_limited_greedy", 4, 1, 2.5),
    ],
)
def test_v2_route_equals_upstream(e, k, method, n_group, topk_group, scaling):
    gen = torch.Generator().manual_seed(e + k)
    logits = torch.randn(37, e, generator=gen) * 3
    _, want_w, want_ids = _v2_router(e, k, method, n_group, topk_group, scaling)(logits)
    w, ids = dr.deepseek_v2_route(
        logits, top_k=k, method=method, n_group=n_group, topk_group=topk_group, scaling=scaling
    )
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    torch.testing.assert_close(_dense(w, ids, e), _dense(want_w, want_ids, e), rtol=0, atol=0)
    assert torch.equal(w, w.sort(dim=-1, descending=True).values)  # best first
    if method == "group_limited_greedy":
        greedy, gids = dr.deepseek_v2_route(logits, top_k=k, scaling=scaling)
        assert not torch.equal(_dense(w, ids, e), _dense(greedy, gids, e))


@pytest.mark.parametrize(
    ("e", "k", "n_group", "topk_group", "renorm", "scaling"),
    [
        (256, 8, 8, 4, True, 2.5),  # DeepSeek-V3
        (64, 6, 8, 3, False, 1.0),
        (16, 4, 4, 2, True, 1.5),
    ],
)
def test_v3_route_equals_upstream(e, k, n_group, topk_group, renorm, scaling):
    gen = torch.Generator().manual_seed(e * k)
    logits = torch.randn(41, e, generator=gen) * 2
    bias = torch.randn(e, generator=gen) * 0.3
    router = _v3_router(e, k, n_group, topk_group, renorm, scaling, bias)
    _, want_w, want_ids = router(logits)
    w, ids = dr.deepseek_v3_route(
        logits,
        bias,
        top_k=k,
        n_group=n_group,
        topk_group=topk_group,
        renormalize=renorm,
        scaling=scaling,
    )
    torch.testing.assert_close(_dense(w, ids, e), _dense(want_w, want_ids, e), rtol=1e-6, atol=0)
    if renorm:
        torch.testing.assert_close(w.sum(-1), torch.full((41,), scaling))
    # the bias only chooses: the weights are the unbiased sigmoid scores
    unbiased = logits.sigmoid().gather(1, ids.long())
    if not renorm:
        torch.testing.assert_close(w, unbiased * scaling)
    # the group limit binds: every chosen expert lies in the token's kept groups, and without
    # the limit some token chooses otherwise
    per = e // n_group
    assert all(len(set((row // per).tolist())) <= topk_group for row in ids)
    free, fids = dr.deepseek_v3_route(
        logits, bias, top_k=k, n_group=1, topk_group=1, renormalize=renorm, scaling=scaling
    )
    assert not torch.equal(_dense(w, ids, e), _dense(free, fids, e))


def _valid_top_k(choice, allowed, ids):
    """Every chosen expert is allowed and scores at least as high as every unchosen allowed one."""
    for row in range(choice.shape[0]):
        chosen = set(ids[row].tolist())
        assert all(allowed[row, c] for c in chosen)
        low = min(choice[row, c].item() for c in chosen)
        others = [
            choice[row, j].item()
            for j in range(choice.shape[1])
            if allowed[row, j] and j not in chosen
        ]
        assert not others or max(others) <= low


def _lower_first(scores, ids):
    """Ids come best first, equal scores in index order."""
    for row in range(scores.shape[0]):
        r = ids[row].tolist()
        for a, b in zip(r, r[1:], strict=False):
            assert scores[row, a] > scores[row, b] or a < b


def test_v2_greedy_ties_lower_index_wins_and_match_upstream_scores():
    gen = torch.Generator().manual_seed(5)
    e, k = 16, 3
    logits = torch.randint(0, 3, (50, e), generator=gen).float()  # many ties at every cut
    w, ids = dr.deepseek_v2_route(logits, top_k=k)
    _, uw, _ = _v2_router(e, k, "greedy", 1, 1, 1.0)(logits)
    torch.testing.assert_close(w, uw.sort(dim=-1, descending=True).values)
    scores = logits.softmax(-1)
    _valid_top_k(scores, torch.ones_like(scores, dtype=torch.bool), ids)
    _lower_first(scores, ids)


def test_v2_group_limited_ties_keep_the_lower_groups():
    """Tied group scores at the cut: upstream may keep either group (its weights then differ);
    here the lower groups are kept, and the experts are a valid top-k of them."""
    gen = torch.Generator().manual_seed(6)
    e, k, n_group, topk_group = 16, 3, 4, 2
    logits = torch.randint(0, 3, (50, e), generator=gen).float()
    w, ids = dr.deepseek_v2_route(
        logits, top_k=k, method="group_limited_greedy", n_group=n_group, topk_group=topk_group
    )
    scores = logits.softmax(-1)
    best = scores.view(50, n_group, -1).max(-1).values
    kept = torch.sort(best, dim=-1, descending=True, stable=True).indices[:, :topk_group]
    allowed = dr.group_mask(scores, n_group, topk_group, 1)
    for row in range(50):
        groups = {j // (e // n_group) for j in range(e) if allowed[row, j]}
        assert groups == set(kept[row].tolist())
    _valid_top_k(scores, allowed, ids)
    _lower_first(scores, ids)
    # where the group scores do not tie at the cut, upstream keeps the same groups, so its
    # weights are the same values (tied experts at the cut may differ, their scores cannot)
    _, uw, uids = _v2_router(e, k, "group_limited_greedy", n_group, topk_group, 1.0)(logits)
    sb = best.sort(dim=-1, descending=True).values
    clear = sb[:, topk_group - 1] > sb[:, topk_group]
    assert 0 < int(clear.sum()) < 50  # both kinds of rows occur
    torch.testing.assert_close(w[clear], uw.sort(dim=-1, descending=True).values[clear])


def test_v3_tied_groups_go_to_the_lower_group():
    """Two groups with equal top-2 sums, one kept: the lower group wins, as its experts show."""
    e, k = 8, 2
    logits = torch.full((1, e), -4.0)
    logits[0, [0, 1]] = torch.tensor([1.0, 0.5])  # group 0
    logits[0, [6, 7]] = torch.tensor([0.5, 1.0])  # group 3: the same sum
    w, ids = dr.deepseek_v3_route(
        logits, torch.zeros(e), top_k=k, n_group=4, topk_group=1, renormalize=True
    )
    assert sorted(ids[0].tolist()) == [0, 1]
    _, uw, uids = _v3_router(e, k, 4, 1, True, 1.0, torch.zeros(e))(logits)
    assert sorted(uids[0].tolist()) in ([0, 1], [6, 7])  # upstream picks either
    torch.testing.assert_close(w.sort().values, uw.sort().values)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2, "method": "noaux_tc"}, "topk_method"),
        ({"top_k": 2, "method": "group_limited_greedy", "n_group": 3, "topk_group": 1}, "groups"),
        ({"top_k": 2, "method": "group_limited_greedy", "n_group": 4, "topk_group": 5}, "groups"),
    ],
)
def test_bad_router_inputs_get_one_clear_error(kwargs, words):
    with pytest.raises(dr.RouteInputError, match=f"error: .*{words}"):
        dr.deepseek_v2_route(torch.randn(3, 8), **kwargs)


def test_bad_logits_and_bias_get_one_clear_error():
    with pytest.raises(dr.RouteInputError, match="error: router logits must be fp32"):
        dr.deepseek_v2_route(torch.randn(3, 8).bfloat16(), top_k=2)
    with pytest.raises(dr.RouteInputError, match="error: e_score_correction_bias"):
        dr.deepseek_v3_route(
            torch.randn(3, 8), torch.zeros(7), top_k=2, n_group=2, topk_group=1, renormalize=True
        )
