"""
Mutators of the tests of Django-shaped mutation edges (tests/api/test_mutation_edges.py,
tests/realtime/test_mutation_edges.py): validation errors, permission classes, results.
"""

from rest_framework import serializers
from rest_framework.permissions import BasePermission

from rindle_app.mutators import MutationRejected, mutator


class UserArgs(serializers.Serializer):
    id = serializers.CharField(max_length=40)
    name = serializers.CharField(max_length=10)


@mutator("t_edgeAddUser", args=UserArgs)
def add_user(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": args["name"]})


@mutator("t_edgeValidatesInside")
def validates_inside(tx, args, user):
    """A mutator written like a DRF view: it validates with raise_exception=True."""
    tx.insert("user", {"id": "written-before", "name": "x"})
    serializer = UserArgs(data=args)
    serializer.is_valid(raise_exception=True)
    tx.insert("user", dict(serializer.validated_data))


@mutator("t_edgeFullClean")
def full_clean(tx, args, user):
    """A mutator that validates with the model (Django's ValidationError)."""
    from project.demo.models import User

    tx.insert("user", {"id": "written-before", "name": "x"})
    User(id=args.get("id", ""), name=args.get("name", "")).full_clean(validate_unique=False)


@mutator("t_edgeRejectsWithDetails")
def rejects_with_details(tx, args, user):
    raise MutationRejected("that slot is taken", code="slot_taken", details={"slot": args})


class IsNamedAlice(BasePermission):
    message = "only alice may do this"

    def has_permission(self, request, view):
        return getattr(request.user, "username", None) == "alice"


class HoldsAdminScope(BasePermission):
    """Reads the bearer token on ``request.auth``, the way a DRF permission does."""

    message = "this takes a token with the admin scope"

    def has_permission(self, request, view):
        return request.method == "POST" and bool(
            request.auth is not None and "admin" in request.auth.scopes
        )


@mutator("t_edgeAliceOnly", permission_classes=[IsNamedAlice])
def alice_only(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": "by alice"})


@mutator("t_edgeAdminToken", permission_classes=[HoldsAdminScope])
def admin_token(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": "by admin"})


@mutator("t_edgeOpen", permission_classes=[])
def open_to_all(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": "open"})


@mutator("t_edgeDefault")
def default_permissions(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": "default"})


@mutator("t_edgeCreate")
def create(tx, args, user):
    """Client-generated key: the client picks ``id``; the result echoes what was made."""
    tx.insert("user", {"id": args["id"], "name": args["name"]})
    return {"id": args["id"], "slug": args["name"].lower()}


@mutator("t_edgeReturns")
def returns(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": "returns"})
    return args["value"]


@mutator("t_edgeReturnsObject")
def returns_object(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": "returns"})
    return object()
