"""``POST /v1/sql/migrate``: the migrations journal over HTTP (see ``engine.journal``)."""

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import BasePermission
from rest_framework.response import Response

from ..engine import RindleError, Unavailable, get_engine, journal
from ..exceptions import INSUFFICIENT_SCOPE, NOT_SUPERUSER
from ..models import RindleToken
from .serializers import ErrorResponse
from .views import RindleView

MAX_MIGRATIONS_PER_REQUEST = 100


class MayMigrate(BasePermission):
    """
    A token must hold the ``migrate`` scope (``admin`` holds it); any other request
    must come from a signed-in superuser, since a migration changes the schema.
    """

    message = "Migrations need a token with the migrate scope or a superuser session."
    code = INSUFFICIENT_SCOPE

    def has_permission(self, request, view):
        if isinstance(request.auth, RindleToken):
            return request.auth.has_scope("migrate")
        user = request.user
        if user is not None and user.is_authenticated and not user.is_superuser:
            self.code = NOT_SUPERUSER
        return bool(user is not None and user.is_authenticated and user.is_superuser)


class MigrationSerializer(serializers.Serializer):
    id = serializers.CharField(
        trim_whitespace=False, help_text="The migration's id, e.g. its file stem."
    )
    checksum = serializers.CharField(
        required=False,
        allow_null=True,
        trim_whitespace=False,
        help_text="Optional SHA-256 (hex) of the migration's file, bound to the id.",
    )
    overrideHash = serializers.CharField(
        required=False,
        allow_null=True,
        trim_whitespace=False,
        help_text="The stored checksum, to accept a cosmetic edit (OVERRIDE_HASH).",
    )
    statements = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False, allow_blank=True),
        allow_empty=False,
        help_text="SQL text; each item may hold several statements separated by ';'.",
    )


class MigrateRequest(serializers.Serializer):
    """One migration (its fields at the top level), or ``migrations``: several, in order."""

    id = serializers.CharField(required=False, trim_whitespace=False)
    checksum = serializers.CharField(required=False, allow_null=True, trim_whitespace=False)
    overrideHash = serializers.CharField(required=False, allow_null=True, trim_whitespace=False)
    statements = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False, allow_blank=True),
        allow_empty=False,
        required=False,
    )
    migrations = MigrationSerializer(
        many=True,
        required=False,
        allow_empty=False,
        max_length=MAX_MIGRATIONS_PER_REQUEST,
    )

    def validate(self, data):
        single = {"id", "checksum", "overrideHash", "statements"} & set(data)
        if "migrations" in data:
            if single:
                raise serializers.ValidationError("send one migration or 'migrations', not both")
            return data
        missing = [f for f in ("id", "statements") if f not in data]
        if missing:
            raise serializers.ValidationError(f"missing {missing} (or send 'migrations')")
        return data


class MigrationOutcome(serializers.Serializer):
    id = serializers.CharField()
    kind = serializers.ChoiceField(["ddl", "dml"])
    applied = serializers.BooleanField(help_text="False: already journaled; nothing ran.")
    hashOverridden = serializers.BooleanField()
    schemaVersion = serializers.CharField(
        allow_null=True, help_text="The id of the latest applied DDL migration."
    )
    destructive = serializers.ListField(
        child=serializers.CharField(), help_text="The destructive statements (drops)."
    )
    report = serializers.DictField(help_text="The apply report stored with the marker.")
    cv = serializers.IntegerField(
        allow_null=True, help_text="The commit version, when this request applied it."
    )


class MigrateBatchResponse(serializers.Serializer):
    results = MigrationOutcome(many=True, help_text="Outcomes up to the failing migration.")
    schemaVersion = serializers.CharField(allow_null=True)
    error = serializers.CharField(required=False, help_text="Why the failing migration failed.")
    errorCode = serializers.CharField(required=False)
    failedId = serializers.CharField(required=False)


class MigrateView(RindleView):
    """
    ``POST /v1/sql/migrate``: apply journaled migrations, each once.

    One migration answers its outcome, or its error (400 refused, 409 the id is
    journaled with other SQL, 413 too large). ``migrations`` applies several in
    order and stops at the first failure: the earlier ones stay committed, and the
    answer is 200 with ``error``, ``errorCode`` and ``failedId``. A malformed or
    refused migration anywhere in the list applies nothing (400, ``failedId``).
    """

    permission_classes = [MayMigrate]
    required_scope = "migrate"

    @extend_schema(
        operation_id="rindle_sql_migrate",
        summary="Apply journaled migrations",
        request=MigrateRequest,
        responses={
            200: OpenApiResponse(
                MigrationOutcome,
                description="The outcome; with `migrations`, a `MigrateBatchResponse`.",
            ),
            **{status: OpenApiResponse(ErrorResponse) for status in (400, 401, 403, 409, 413, 503)},
        },
        examples=[
            OpenApiExample(
                "create a table",
                request_only=True,
                value={
                    "id": "0001_notes",
                    "statements": ["CREATE TABLE note (id TEXT PRIMARY KEY, body TEXT)"],
                },
            )
        ],
    )
    def post(self, request):
        data = self.validated(MigrateRequest)
        if "migrations" not in data:
            return Response(journal.apply(get_engine(), _parse(data)).as_dict())
        migrations = []
        for item in data["migrations"]:
            try:
                migrations.append(_parse(item))
            except RindleError as exc:
                exc.details["failedId"] = item["id"]
                raise
        engine = get_engine()
        results, body = [], {}
        for migration in migrations:
            try:
                results.append(journal.apply(engine, migration).as_dict())
            except Unavailable:
                raise
            except RindleError as exc:
                body = {"error": exc.message, "errorCode": exc.code, "failedId": migration.id}
                break
        version = engine.write(journal.schema_version).value
        return Response(
            {"results": results, "schemaVersion": version, **body},
        )


def _parse(data):
    return journal.parse(
        data["id"],
        data["statements"],
        checksum=data.get("checksum"),
        override_hash=data.get("overrideHash"),
    )
