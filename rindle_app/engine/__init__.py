"""
The engine: the single writer, the table map, capture into the outbox and the
write planes. Import from here; the submodules are implementation.
"""

from .engine import Engine, get_engine, running_engine, shutdown
from .errors import (
    ClientIdTaken,
    EngineClosed,
    InvalidInput,
    MutationGap,
    Overloaded,
    RindleError,
    Unavailable,
    UnknownTable,
)
from .mutations import MutationRejected, MutationResult, mutator
from .registry import synced
from .writer import Commit

__all__ = [
    "ClientIdTaken",
    "Commit",
    "Engine",
    "EngineClosed",
    "InvalidInput",
    "MutationGap",
    "MutationRejected",
    "MutationResult",
    "Overloaded",
    "RindleError",
    "Unavailable",
    "UnknownTable",
    "get_engine",
    "mutator",
    "running_engine",
    "shutdown",
    "synced",
]
