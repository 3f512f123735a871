"""
The engine: the single writer, the table map, capture into the outbox and the
write planes. Import from here; the submodules are implementation.
"""

from . import errors
from .engine import Engine, get_engine, running_engine, shutdown
from .errors import *  # noqa: F403 (the engine's error classes: errors.__all__)
from .mutations import MutationRejected, MutationResult, mutator
from .registry import synced
from .writer import Commit

__all__ = [
    *errors.__all__,
    "Commit",
    "Engine",
    "MutationRejected",
    "MutationResult",
    "get_engine",
    "mutator",
    "running_engine",
    "shutdown",
    "synced",
]
