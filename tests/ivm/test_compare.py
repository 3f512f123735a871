"""COMPARATOR_VERSION 2: the original's vectors, and predicate semantics."""

import json
import struct
from pathlib import Path

import pytest

from rindle_app.ivm.compare import (
    COMPARATOR_VERSION,
    compare,
    like,
    matches,
    reverse_sort_key,
    sort_key,
)

VECTORS = Path(__file__).resolve().parents[1] / "conformance" / "compare-vectors.json"


def decode(value):
    if isinstance(value, dict) and "bits" in value:
        return struct.unpack(">d", int(value["bits"], 16).to_bytes(8, "big"))[0]
    return value


def test_every_recorded_comparator_vector_holds():
    """Our comparator orders every pair of the original's vectors the same way."""
    vectors = json.loads(VECTORS.read_text())
    assert len(vectors) >= 18
    for v in vectors:
        a, b = decode(v["a"]), decode(v["b"])
        assert compare(a, b) == v["expected"], v
        assert compare(b, a) == -v["expected"], v
    assert COMPARATOR_VERSION == 2


def test_integers_and_floats_share_one_number_domain_and_stay_exact():
    """1 == 1.0, and integers beyond 2**53 keep their exact order."""
    assert compare(1, 1.0) == 0
    assert compare(2**53 + 1, 2**53) == 1
    assert compare(2**53 + 1, float(2**53)) == 1
    assert sort_key(True) != sort_key(1)  # booleans are not numbers


def test_reverse_sort_key_is_the_exact_reverse_of_sort_key():
    """A descending key orders every pair of values opposite to sort_key, and equal ones equal."""
    nan = float("nan")
    values = [None, False, True, -nan, float("-inf"), -(2**60) - 1, -1.5, -1, -0.0, 0.0, 0]
    values += [1, 1.0, 2**53, 2**53 + 1, float(2**53), float("inf"), nan, "", "a", "ab", "b"]
    values += ["é", [1, 2], {"a": 1}]
    for a in values:
        for b in values:
            ka, kb = sort_key(a), sort_key(b)
            ra, rb = reverse_sort_key(a), reverse_sort_key(b)
            assert (ra < rb) == (kb < ka), (a, b)
            assert (ra > rb) == (kb > ka), (a, b)
            assert (ra == rb) == (ka == kb), (a, b)


@pytest.mark.parametrize(
    "cell, pattern, fold, expected",
    [
        ("Hello", "H%", False, True),
        ("hello", "H%", False, False),  # LIKE is case-sensitive
        ("hello", "H%", True, True),  # ILIKE folds ASCII
        ("ÉCOLE", "école", True, False),  # ...and only ASCII
        ("a_c", "a\\_c", False, True),
        ("abc", "a\\_c", False, False),
        ("50%", "50\\%", False, True),
        ("a\nb", "a_b", False, True),
        (None, "%", False, False),
        (5, "%", False, False),
    ],
)
def test_like_and_ilike(cell, pattern, fold, expected):
    """LIKE: case-sensitive, backslash escapes; ILIKE folds ASCII only; non-text never matches."""
    assert like(cell, pattern, fold=fold) is expected


@pytest.mark.parametrize(
    "op, cell, literal, expected",
    [
        ("=", None, None, False),
        ("=", 1, 1.0, True),
        ("!=", None, 1, False),
        ("IS", None, None, True),
        ("IS NOT", None, 1, True),
        ("<", None, 1, False),
        ("IN", 2, (1, 2), True),
        ("IN", None, (None,), False),
        ("NOT IN", 3, (1, 2), True),
        ("NOT IN", 3, (1, None), False),
        ("NOT LIKE", None, "%", False),
        ("NOT LIKE", "abc", "x%", True),
        (">=", "b", "a", True),
    ],
)
def test_simple_predicates(op, cell, literal, expected):
    """Null never satisfies a comparison except through IS / IS NOT."""
    assert matches(op, cell, literal) is expected
