"""The repository's copy of the original's conformance data equals shared/conformance."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
COPY = HERE / "conformance"
SHARED = HERE.parent.parent / "shared" / "conformance"


def test_the_vendored_conformance_data_matches_the_shared_copy():
    """Fixtures copied into tests/conformance are byte-identical to shared/ (when present)."""
    if not SHARED.is_dir():
        pytest.skip("shared/ is not beside this checkout")
    shared = {p.relative_to(SHARED): p.read_bytes() for p in SHARED.rglob("*") if p.is_file()}
    copied = {p.relative_to(COPY): p.read_bytes() for p in COPY.rglob("*") if p.is_file()}
    assert shared == copied
