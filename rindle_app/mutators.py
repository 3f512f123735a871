"""
Public API: write mutators, the server functions clients call by name.

::

    from rindle_app.mutators import MutationRejected, mutator

    @mutator("addIssue", args=IssueArgs)
    def add_issue(tx, args, user):
        if user is None:
            raise MutationRejected("sign in first")
        tx.insert(Issue, id=args["id"], title=args["title"], owner_id=user.pk)

A mutator runs on the engine's writer thread inside one transaction with the
client's lmid; raising ``MutationRejected`` (or any business error) rolls its
writes back, ORM writes included, and still advances the lmid. ``Tx`` documents
the helpers a mutator writes with.

``MutationRejected(reason, code, details={...})`` carries JSON details to the client;
invalid arguments (the ``args`` serializer, a DRF or Django ``ValidationError`` raised
inside) are ``invalid_args`` with DRF's field errors as the details.
``@mutator(..., permission_classes=[IsAuthenticated])`` asks DRF permission classes
on every transport (``permission_denied`` when one refuses), and a mutator's return
value travels back as the HTTP outcome's ``result`` (see ``mutator``).

``room_mutator(profile)`` registers a ROOM mutator: the room host of a doc of that
profile runs it in memory, ``fn(tx, args)`` over the room's rows (``tx.get``,
``tx.add``, ``tx.edit``, ``tx.remove``); raising ``MutationRejected`` rejects it.
"""

from .engine.mutations import MutationRejected, mutator
from .engine.tx import Tx
from .rooms import room_mutator

__all__ = ["MutationRejected", "Tx", "mutator", "room_mutator"]
