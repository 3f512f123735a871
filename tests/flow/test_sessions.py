"""The distinct-sessions sketch: exact while small, mergeable in any order."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rindle_app.flow.sessions import K, add_ids, estimate, merge, session_hash

from ..conftest import examples


def test_the_hash_is_stable_across_processes():
    """A fixed value: Python's salted hash() would differ from process to process."""
    assert session_hash("session-1") == 0x5724DE966A31F3D6
    assert 0 <= session_hash("\ud800 lone surrogate") < 2**63


ids = st.lists(st.text(min_size=1, max_size=12), max_size=3 * K)


@settings(max_examples=examples(60))
@given(ids, ids, ids)
def test_merge_is_commutative_associative_and_idempotent(a, b, c):
    sa, sb, sc = add_ids((), a), add_ids((), b), add_ids((), c)
    assert merge(sa, sb) == merge(sb, sa)
    assert merge(merge(sa, sb), sc) == merge(sa, merge(sb, sc))
    assert merge(sa, sa) == sa
    assert merge(sa, sb) == add_ids((), a + b)  # rows merged = all ids seen once


@settings(max_examples=examples(60))
@given(st.lists(st.text(min_size=1, max_size=12), max_size=K - 1))
def test_small_counts_are_exact(session_ids):
    assert estimate(add_ids((), session_ids)) == len(set(session_ids))


def test_large_counts_are_estimated_within_a_few_percent():
    rng = random.Random(7)
    for n in (K, 1_000, 50_000):
        session_ids = [f"{rng.random()}" for _ in range(n)]
        sketch = add_ids((), session_ids)
        assert len(sketch) <= K
        assert abs(estimate(sketch) - n) / n < 0.2
