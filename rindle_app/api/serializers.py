"""Request and response bodies of the HTTP API: validation and the OpenAPI document."""

from rest_framework import serializers

from ..engine.mutations import MAX_CLIENT_ID_LENGTH

NAME_MAX = 200
# The clients are JavaScript: a mid beyond 2**53 - 1 cannot be a number they sent.
MAX_MID = 2**53 - 1


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers instead of turning them into text."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """An IntegerField that takes JSON integers only (no strings, floats or booleans)."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """A BooleanField that takes JSON true and false only (no "yes", 1 or "true")."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class AnyJSONField(serializers.JSONField):
    """Any JSON value, null included."""

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_null", True)
        kwargs.setdefault("default", None)
        super().__init__(**kwargs)


# --- requests ---------------------------------------------------------------------------


class QueryRequest(serializers.Serializer):
    name = StrictCharField(max_length=NAME_MAX, trim_whitespace=False)
    args = AnyJSONField(help_text="The named query's arguments (null when it takes none).")
    clientId = StrictCharField(
        max_length=MAX_CLIENT_ID_LENGTH,
        trim_whitespace=False,
        required=False,
        allow_null=True,
        default=None,
        help_text="The client the lease is for; a subscription checks it against its init.",
    )


class ReadRequest(serializers.Serializer):
    name = StrictCharField(max_length=NAME_MAX, trim_whitespace=False)
    args = AnyJSONField(help_text="The named query's arguments (null when it takes none).")


class Envelope(serializers.Serializer):
    clientID = StrictCharField(max_length=MAX_CLIENT_ID_LENGTH, trim_whitespace=False)
    mid = StrictIntegerField(min_value=1, max_value=MAX_MID)
    name = StrictCharField(max_length=NAME_MAX, trim_whitespace=False)
    args = AnyJSONField(help_text="The mutator's arguments.")


class MutateRequest(serializers.Serializer):
    envelope = Envelope(required=False, help_text="One mutation.")
    envelopes = Envelope(
        many=True, required=False, help_text="Mutations of one client, in mid order."
    )

    def validate(self, attrs):
        if ("envelope" in attrs) == ("envelopes" in attrs):
            raise serializers.ValidationError("send exactly one of envelope and envelopes")
        return attrs


# --- responses --------------------------------------------------------------------------


class ErrorDetail(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    retryable = serializers.BooleanField(required=False)
    lmid = serializers.IntegerField(required=False, help_text="mid_gap: the stored lmid.")
    details = serializers.DictField(
        required=False,
        help_text="invalid_request: DRF's field errors of the body "
        '({"envelope": {"mid": ["A valid integer is required."]}}).',
    )


class ErrorResponse(serializers.Serializer):
    error = ErrorDetail()


class LifecycleLease(serializers.Serializer):
    table = serializers.CharField(help_text="The system table the stream serves.")
    leaseToken = serializers.CharField()
    scope = serializers.CharField(required=False, help_text="The doorbell's occupancy scope.")
    doc = serializers.CharField(required=False, help_text="The fence entries' room doc.")
    clientId = serializers.CharField(required=False)


class LifecycleBlock(serializers.Serializer):
    doorbell = LifecycleLease()
    fence = LifecycleLease(many=True, required=False)


class LeaseResponse(serializers.Serializer):
    leaseToken = serializers.CharField(help_text="Subscribe with it: {t: subscribe, leaseToken}.")
    queryKey = serializers.CharField(help_text="The query's dedup key.")
    expiresAt = serializers.IntegerField(help_text="Milliseconds since the epoch.")
    lifecycle = LifecycleBlock(
        required=False,
        help_text="A realtime-labelled query's system streams (REALTIME_LIFECYCLE on).",
    )
    realtime = serializers.DictField(
        required=False,
        help_text="The room serving the query (ROOMS_ENABLED, two sessions): {sourceKey, "
        "wsEndpoint, roomToken, exp, doc, tables}.",
    )
    realtimeFence = serializers.DictField(
        required=False,
        help_text="A downgrade's fence {sourceKey, doc, finalFlushSeq}: keep the room's rows "
        "until the watermark stream shows finalFlushSeq.",
    )


class ReadResponse(serializers.Serializer):
    rows = serializers.ListField(
        child=serializers.DictField(),
        help_text="{cols: {...}, <alias>: ...} per row; a one-query gives 0 or 1 rows.",
    )
    cvMin = serializers.IntegerField(help_text="The outbox version the rows reflect.")
    queryKey = serializers.CharField()


class MutationOutcome(serializers.Serializer):
    accepted = serializers.BooleanField()
    rejected = serializers.BooleanField()
    duplicate = serializers.BooleanField(
        required=False, help_text="Already processed (mid <= lmid): absorbed, nothing ran."
    )
    reason = serializers.CharField(required=False, help_text="Why it was rejected.")
    code = serializers.CharField(required=False, help_text="The rejection's code.")
    details = serializers.DictField(
        required=False,
        help_text="A rejection's structured details: for invalid_args, DRF's field errors "
        '({"title": ["This field is required."]}).',
    )
    result = serializers.JSONField(
        required=False,
        help_text="What an applied mutator returned (absent when it returned None).",
    )
    lmid = serializers.IntegerField(help_text="The client's lmid after this envelope.")
    cv = serializers.IntegerField(help_text="The outbox version after this envelope.")


class ColumnSchema(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.ChoiceField(choices=["string", "number", "boolean", "json", "int64"])
    nullable = serializers.BooleanField()


class TableSchema(serializers.Serializer):
    name = serializers.CharField()
    columns = ColumnSchema(many=True)
    primaryKey = serializers.ListField(child=serializers.CharField())


class SchemaResponse(serializers.Serializer):
    tables = TableSchema(many=True)
