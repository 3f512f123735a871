"""
rindle's pytest plugin: ``pytest_plugins = ["rindle_app.pytest_plugin"]`` in a
project's ``conftest.py`` gives its tests the fixture ``rindle_runtime``.
"""

import pytest

from .testing import fresh_runtime


@pytest.fixture
def rindle_runtime():
    """A fresh runtime of the default alias (``rindle_app.testing.fresh_runtime``)."""
    with fresh_runtime() as runtime:
        yield runtime
