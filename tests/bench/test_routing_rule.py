"""The routing-aware referee's rule on plain tensors: near-ties, the other side of a tie, the
margin, which tokens an alternate may score, and the min over references; a group limit's
near-ties and the other side of them."""

import math

import torch
from tilegym_hf_bench.routing import Referee
from tilegym_hf_bench.routing_rule import (
    MAX_POSITION_PLANS,
    TIE_MARGIN_FACTOR,
    combine,
    eligible_tokens,
    group_gap,
    groups_within_reach,
    layer_swaps_at,
    near_tied,
    same_selection,
    score_noise,
    selection_gap,
    swap_plans,
    swapped_groups,
    swapped_selection,
    tie_margin,
    within_reach,
    worst_to_refine,
)

SCORES = torch.tensor(
    [
        [0.40, 0.30, 0.29, 0.01],  # 2nd and 3rd 0.01 apart
        [0.50, 0.30, 0.15, 0.05],  # 0.15 apart
        [0.26, 0.25, 0.25, 0.24],  # chosen [0, 1]: 0.00 apart (an exact tie)
    ]
)
CHOSEN = torch.tensor([[0, 1], [1, 0], [0, 1]])
REAL = torch.tensor([True, True, True])


def test_the_gap_is_the_weakest_chosen_score_minus_the_strongest_unchosen_one():
    gap = selection_gap(SCORES, CHOSEN)
    assert torch.allclose(gap, torch.tensor([0.01, 0.15, 0.0]), atol=1e-6)
    every = torch.tensor([[0, 1, 2, 3]])
    assert math.isinf(float(selection_gap(SCORES[:1], every)[0]))  # nothing left to swap in


def test_a_group_gap_is_the_weakest_kept_group_minus_the_strongest_dropped_one():
    groups = torch.tensor([[0.9, 0.5, 0.48, 0.1], [0.3, 0.9, 0.1, 0.8]])
    assert torch.allclose(group_gap(groups, 2), torch.tensor([0.02, 0.5]), atol=1e-6)
    assert math.isinf(float(group_gap(groups[:1], 4)[0]))  # every group kept: no group tie


def test_the_other_side_of_a_group_tie_trades_the_weakest_kept_group():
    groups = torch.tensor([[0.9, 0.5, 0.48, 0.1], [0.3, 0.9, 0.1, 0.8]])
    assert swapped_groups(groups, 2).tolist() == [
        [True, False, True, False],
        [True, True, False, False],
    ]


def test_only_real_tokens_closer_than_the_margin_are_near_ties():
    assert near_tied(SCORES, CHOSEN, 0.02, REAL).tolist() == [True, False, True]
    assert near_tied(SCORES, CHOSEN, 0.005, REAL).tolist() == [False, False, True]
    padded = torch.tensor([False, True, True])
    assert near_tied(SCORES, CHOSEN, 0.02, padded).tolist() == [False, False, True]
    every = torch.tensor([[0, 1, 2, 3]] * 3)
    assert not near_tied(SCORES, every, 1.0, REAL).any()


def test_the_other_side_of_a_tie_replaces_the_weakest_chosen_expert_in_its_slot():
    swapped = swapped_selection(SCORES, CHOSEN)
    assert swapped.tolist() == [[0, 2], [2, 0], [0, 2]]
    assert same_selection(torch.tensor([[2, 0]]), torch.tensor([[0, 2]])).tolist() == [True]
    assert same_selection(torch.tensor([[2, 0]]), torch.tensor([[0, 1]])).tolist() == [False]


def test_the_margin_is_twice_the_largest_measured_difference_on_the_rows_measured():
    high = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    low = torch.tensor([[1.003, 1.999], [9.0, 4.0]])
    rows = torch.tensor([True, False])  # the second row (a pad position) does not count
    assert math.isclose(score_noise(low, high, rows), 0.003, rel_tol=1e-4)
    assert score_noise(low, high, torch.tensor([False, False])) == 0.0
    assert TIE_MARGIN_FACTOR == 2.0 and tie_margin(0.003) == 0.006


def test_a_swap_reaches_its_own_position_and_every_later_one_of_its_row():
    tied = torch.zeros(3, 10, dtype=torch.bool)
    tied[0, 5] = True  # prompt of 4: position 3 predicts generated token 0
    tied[2, 1] = True  # in the prompt: reaches every generated token
    eligible = eligible_tokens(tied, prompt_len=4, new_tokens=6)
    assert eligible.tolist() == [
        [False, False, True, True, True, True],
        [False] * 6,
        [True] * 6,
    ]


def test_a_token_takes_an_alternate_only_where_eligible_and_smaller():
    plain = torch.tensor([[0.5, 0.01, 0.5]])
    alt = torch.tensor([[0.02, 0.001, 0.03]])
    eligible = torch.tensor([[True, True, False]])
    best, took = combine(plain, [(alt, eligible)])
    expected = torch.tensor([[0.02, 0.001, 0.5]])
    assert torch.equal(best, expected)  # the third token had no near-tie before it
    assert took.tolist() == [[True, True, False]]
    worse = torch.tensor([[0.9, 0.9, 0.9]])
    best, took = combine(plain, [(worse, torch.ones_like(eligible)), (alt, eligible)])
    assert torch.equal(best, expected)


def test_without_alternates_the_errors_are_the_plain_ones():
    plain = torch.tensor([[0.3, 0.004]])
    best, took = combine(plain, [])
    assert best is plain and not took.any()


def test_plans_swap_each_scored_position_then_each_layer_then_all_together():
    rows, positions = 2, 6  # T = 12, the scored positions 3..5 of each row
    ties = [torch.zeros(rows * positions, dtype=torch.bool) for _ in range(2)]
    ties[0][[1, 3, 4]] = True  # row 0: prompt position 1, scored 3 and 4
    ties[1][[3, 6 + 5]] = True  # row 0 position 3 (both layers), row 1 position 5
    plans, unplanned = swap_plans(ties, rows, first_scored=3)
    as_sets = [{i: t.nonzero().flatten().tolist() for i, t in p.items()} for p in plans]
    assert as_sets == [
        {0: [3], 1: [3, 11]},  # the first near-tied scored position of each row
        {0: [4]},  # the second (row 1 has none)
        {0: [1, 3, 4]},
        {1: [3, 11]},
        {0: [1, 3, 4], 1: [3, 11]},
    ]
    assert unplanned == 0


def test_no_plan_is_run_twice_and_none_without_near_ties():
    one = [torch.tensor([False, False, True])]
    plans, _ = swap_plans(one, 1, first_scored=1)
    assert len(plans) == 1  # position, layer and all are the same swap
    assert swap_plans([torch.zeros(3, dtype=torch.bool)] * 2, 1, 1) == ([], 0)


def test_scored_positions_past_the_cap_have_no_plan_of_their_own():
    n = MAX_POSITION_PLANS + 6
    plans, unplanned = swap_plans([torch.ones(n, dtype=torch.bool)], 1, first_scored=0)
    assert len(plans) == MAX_POSITION_PLANS + 1 and unplanned == 6


def test_a_token_tied_in_several_layers_gets_each_layers_swap_alone():
    ties = [torch.tensor([False, True, True]), torch.tensor([False, True, False])]
    plans = layer_swaps_at(ties, 1)
    assert [{i: t.nonzero().flatten().tolist() for i, t in p.items()} for p in plans] == [
        {0: [1]},
        {1: [1]},
    ]
    assert layer_swaps_at(ties, 2) == [] and layer_swaps_at(ties, 0) == []


def test_the_worst_token_is_refined_once():
    best = torch.tensor([[0.1, 0.5], [0.3, 0.2]])
    refined = torch.zeros(2, 2, dtype=torch.bool)
    assert worst_to_refine(best, refined) == (0, 1)
    refined[0, 1] = True
    assert worst_to_refine(best, refined) is None  # the maximum sits on a refined token


def test_refining_follows_the_maximum_until_it_sits_on_a_refined_token():
    """Token 2's position is tied in layers 0 and 1; the side flipped layer 1 alone there, so
    only that swap explains it. Then the maximum moves to token 0 (tied in one layer: nothing
    to refine) and refining stops."""
    prompt_len, new = 2, 3  # inputs: positions 0..3; token j is predicted at position 1 + j
    ties = [torch.tensor([False, True, False, True]), torch.tensor([False, False, False, True])]
    seq = torch.zeros(1, prompt_len + new, dtype=torch.long)
    plain = [torch.tensor([[0.05, 0.01, 0.40]])]
    alternates = [[]]
    ran = []

    def run(plan):
        ran.append({i: t.nonzero().flatten().tolist() for i, t in plan.items()})
        err = torch.full((1, new), 0.5)
        if 1 in plan:  # layer 1's swap at position 3 alone matches the side
            err[0, 2] = 0.02
        alternates[0].append((err, torch.tensor([[False, False, True]])))

    forwards = Referee._refine(ties, seq, prompt_len, plain, alternates, run)
    assert ran == [{0: [3]}, {1: [3]}] and forwards == 2
    assert combine(plain[0], alternates[0])[0].max() == 0.05


def test_a_selection_within_reach_is_one_a_margin_wide_error_could_order_first():
    """Row 0's 2nd and 3rd are 0.01 apart: {0, 2} is within a 0.011 margin, not a 0.009 one;
    fp32's own top-k always is; a repeated or masked expert never."""
    picked = torch.tensor([[0, 2], [0, 1], [0, 0], [0, 3]])
    scores = torch.cat([SCORES, torch.tensor([[0.5, 0.2, 0.1, float("-inf")]])])
    assert within_reach(scores, picked, 0.011).tolist() == [True, True, False, False]
    assert within_reach(scores, picked, 0.009).tolist() == [False, True, False, False]
    assert within_reach(scores, picked, 1e9).tolist() == [True, True, False, False]


def test_groups_within_reach_fill_the_reported_groups_with_the_best_others():
    """4 groups of 2 experts, 2 kept. Experts 4 and 0 lie in groups 2 and 0: kept {0, 2}, where
    group 2 is 0.05 below the dropped group 1; three groups can never be kept."""
    groups = torch.tensor([[0.9, 0.6, 0.55, 0.1]] * 3)
    picked = torch.tensor([[4, 0], [0, 1], [0, 2]])
    ok, kept = groups_within_reach(groups, picked, 8, 2, 0.06)
    assert ok.tolist() == [True, True, True]
    assert kept.tolist()[0] == [True, False, True, False]
    assert kept.tolist()[1] == [True, True, False, False]  # one group, filled with the best
    ok, _ = groups_within_reach(groups, picked, 8, 2, 0.04)
    assert ok.tolist() == [False, True, True]
    ok, _ = groups_within_reach(groups[:1], torch.tensor([[0, 2, 4]]), 8, 2, 10.0)
    assert ok.tolist() == [False]
