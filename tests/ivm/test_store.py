"""The memory store's keys: order keys agree with the reference comparator."""

import itertools
from functools import cmp_to_key

from rindle_app.ivm.evaluate import compare_rows
from rindle_app.ivm.store import order_key

VALUES = [None, False, True, float("-inf"), -2, -0.0, 0, 0.5, 2**53 + 1, float("nan"), "", "a"]
VALUES += ["ab", "b", [1], {"k": 1}]


def test_order_keys_order_rows_as_the_comparator_does_in_every_direction():
    """Flat order keys sort mixed-kind rows exactly as compare_rows, asc and desc alike."""
    rows = [{"a": a, "b": b, "id": i} for i, (a, b) in enumerate(itertools.product(VALUES, VALUES))]
    for da, db in itertools.product(("asc", "desc"), repeat=2):
        order_by = (("a", da), ("b", db), ("id", "asc"))
        key = order_key(order_by)
        want = sorted(rows, key=cmp_to_key(lambda x, y, o=order_by: compare_rows(o, x, y)))
        assert sorted(rows, key=key) == want, order_by
        two = order_key(order_by[1:])
        want = sorted(rows, key=cmp_to_key(lambda x, y, o=order_by[1:]: compare_rows(o, x, y)))
        assert sorted(rows, key=two) == want, order_by[1:]
        for x, y in itertools.islice(itertools.product(rows, rows), 0, None, 37):
            assert (key(x) == key(y)) == (compare_rows(order_by, x, y) == 0)
