"""The tokens-versus-correctness front's arithmetic (compressor_2/findings/front.py)."""

from __future__ import annotations

from compressor_2.findings.front import Point, affordable, dominates, pareto_front


def p(cid: int, tokens: float, correctness: float) -> Point:
    return Point(cid, tokens, correctness, fitness=0.0)


def test_a_point_dominates_one_that_is_no_shorter_and_no_more_correct():
    assert dominates(p(1, 10, 0.9), p(2, 12, 0.9))
    assert dominates(p(1, 10, 0.9), p(2, 10, 0.8))
    assert not dominates(p(1, 10, 0.9), p(2, 10, 0.9))  # a tie dominates neither way
    assert not dominates(p(1, 10, 0.8), p(2, 12, 0.9))  # shorter but less correct: a trade-off


def test_the_front_keeps_the_trade_offs_shortest_first_and_drops_the_dominated():
    points = [p(1, 30, 1.0), p(2, 20, 1.0), p(3, 12, 0.99), p(4, 8, 0.95), p(5, 15, 0.98), p(6, 10, 0.985),
              p(7, 25, 0.9)]
    assert [q.id for q in pareto_front(points)] == [4, 6, 3, 2]


def test_exact_ties_are_stood_for_by_the_earliest_candidate():
    assert [q.id for q in pareto_front([p(9, 10, 0.5), p(3, 10, 0.5), p(5, 12, 0.75)])] == [3, 5]
    assert pareto_front([]) == []


def test_the_affordable_candidate_is_the_shortest_within_the_drop_counting_one_exactly_at_it():
    front = pareto_front([p(2, 20, 1.0), p(3, 12, 0.99), p(4, 8, 0.95), p(6, 10, 0.985)])
    assert affordable(front, 1.0, 0.0).id == 2
    assert affordable(front, 1.0, 0.01).id == 3  # 1.0 - 0.01 == 0.99: at the drop counts
    assert affordable(front, 1.0, 0.02).id == 6
    assert affordable(front, 1.0, 0.05).id == 4
    assert affordable(front, 1.01, 0.0) is None


def test_on_held_out_bounds_the_fewest_held_out_tokens_within_the_drop_is_chosen():
    from compressor_2.findings.front import affordable_bound

    # (point on the pool, held-out tokens, upper bound of the held-out drop)
    checked = [(p(4, 8, 0.95), 8.5, 0.09), (p(6, 10, 0.985), 9.0, 0.031), (p(3, 12, 0.99), 11.0, 0.02),
               (p(2, 20, 1.0), 19.0, 0.015)]
    assert affordable_bound(checked, 0.1).id == 4
    assert affordable_bound(checked, 0.031).id == 6  # at the bound counts
    assert affordable_bound(checked, 0.02).id == 3
    assert affordable_bound(checked, 0.01) is None
