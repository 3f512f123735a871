"""The engine's error types, defined in ``rindle_app.exceptions`` (imported from here too)."""

from ..exceptions import (
    AnonymousMutationsDisabled,
    ClientIdTaken,
    EngineClosed,
    InvalidInput,
    MutationGap,
    Overloaded,
    RindleError,
    Unavailable,
    UnknownTable,
)

__all__ = [
    "AnonymousMutationsDisabled",
    "ClientIdTaken",
    "EngineClosed",
    "InvalidInput",
    "MutationGap",
    "Overloaded",
    "RindleError",
    "Unavailable",
    "UnknownTable",
]
