"""The engine's error types: each carries a machine-readable ``code``."""


class RindleError(Exception):
    """
    Base of every error rindle reports to a caller.

    ``code`` is stable and machine-readable; ``status`` is the HTTP status the
    transport maps it to; ``retryable`` tells a client whether the same request
    may succeed later unchanged.
    """

    code = "error"
    status = 400
    retryable = False

    def __init__(self, message, *, code=None, **details):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details

    def as_dict(self):
        return {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            **self.details,
        }


class InvalidInput(RindleError):
    """The request is malformed; nothing was written."""

    code = "invalid_input"


class UnknownTable(InvalidInput):
    """The table is not registered with the engine (or does not exist)."""

    code = "unknown_table"


class MutationGap(RindleError):
    """A client mutation id skipped ahead of the stored lmid + 1; nothing was written."""

    code = "mid_gap"
    status = 409

    def __init__(self, client_id, mid, lmid):
        super().__init__(
            f"client {client_id!r} sent mutation {mid} but the next expected is {lmid + 1}",
            lmid=lmid,
        )
        self.lmid = lmid


class ClientIdTaken(RindleError):
    """The client id belongs to another principal; nothing was read or written."""

    code = "client_id_taken"
    status = 403

    def __init__(self, client_id):
        super().__init__(f"client id {client_id!r} belongs to another principal")


class Unavailable(RindleError):
    """
    The request could not complete now; retry it unchanged.

    For a database failure nothing was written. For ``code="timeout"`` the request
    is still queued and may commit later: a retried client mutation is absorbed by
    its mid, but a plain ``engine.write`` retried after a timeout can run twice.
    """

    code = "unavailable"
    status = 503
    retryable = True


class EngineClosed(Unavailable):
    """The engine is shutting down or closed."""

    code = "engine_closed"


class Overloaded(Unavailable):
    """The writer's queue is full."""

    code = "overloaded"


class AnonymousMutationsDisabled(RindleError):
    """A client mutation from nobody, where anonymous writes are not allowed."""

    code = "anonymous_mutations_disabled"
    status = 403
