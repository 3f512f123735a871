"""
The machine write planes over HTTP: foreign producers' sequenced writes and
change-source batches. Each route validates the whole body before anything is
queued, and answers the engine's verdict: applied, absorbed (``applied: false``),
or an error with a code and nothing written.

A producer id is bound to the authenticated principal (``user:<pk>``): the first
write claims it, and another principal is refused with ``producer_not_owned``.
"""

import logging

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from ..engine import get_engine
from ..engine.errors import InvalidInput
from ..engine.sources import SourceHashMismatch
from ..exceptions import INVALID_REQUEST, UNSUPPORTED, NotFound
from .permissions import TokenWithScope
from .serializers import ErrorResponse, StrictCharField, StrictIntegerField
from .views import RindleView

logger = logging.getLogger("rindle.api")

MAX_SEQ = 2**63 - 1
ROOM_FIELDS = ("doc", "epoch", "cas")


def _errors(*statuses):
    return {status: OpenApiResponse(ErrorResponse) for status in statuses}


def principal(request):
    """The identity a producer id is bound to: the authenticated user."""
    return f"user:{request.user.pk}"


class ChangesField(serializers.ListField):
    """The row changes, checked against the table map by the engine (its codes)."""

    child = serializers.JSONField()

    def __init__(self, **kwargs):
        kwargs.setdefault("help_text", "Row changes: {table, op: add|edit|remove, row?, old?}.")
        super().__init__(**kwargs)


class ProducerWriteRequest(serializers.Serializer):
    producer = StrictCharField(max_length=255, trim_whitespace=False)
    seq = StrictIntegerField(min_value=1, max_value=MAX_SEQ)
    changes = ChangesField()


class ProducerWriteResponse(serializers.Serializer):
    applied = serializers.BooleanField(help_text="False: a replay, absorbed.")
    seq = serializers.IntegerField(help_text="The producer's stored seq after this write.")
    cv = serializers.IntegerField()


class ProducerSeqResponse(serializers.Serializer):
    producer = serializers.CharField()
    seq = serializers.IntegerField(help_text="0 for a producer that never wrote.")


class SourceBatchBody(serializers.Serializer):
    offset = StrictCharField(max_length=255, trim_whitespace=False)
    chunk_seq = StrictIntegerField(required=False, default=-1, min_value=-1, max_value=MAX_SEQ)
    run_id = StrictCharField(max_length=255, trim_whitespace=False, required=False, default=None)
    batchHash = StrictCharField(max_length=255, trim_whitespace=False, required=False, default=None)
    head = serializers.DictField(required=False, default=None)
    changes = ChangesField()


class SourceBatchRequest(SourceBatchBody):
    source = StrictCharField(max_length=255, trim_whitespace=False)


class CheckpointSerializer(serializers.Serializer):
    offset = serializers.CharField()
    chunkSeq = serializers.IntegerField()
    runId = serializers.CharField(allow_null=True)
    batchHash = serializers.CharField(allow_null=True)
    head = serializers.DictField(allow_null=True)


class SourceBatchResponse(serializers.Serializer):
    applied = serializers.BooleanField(help_text="False: at or below the stored position.")
    cv = serializers.IntegerField()
    checkpoint = CheckpointSerializer()


class RunIdRequest(serializers.Serializer):
    offset = StrictCharField(max_length=255, trim_whitespace=False)
    previous = StrictCharField(max_length=255, trim_whitespace=False)
    next = StrictCharField(max_length=255, trim_whitespace=False)


class MachineView(RindleView):
    """A machine write plane: bearer tokens only, each route its scope."""

    permission_classes = [TokenWithScope]


class StrictBodyView(MachineView):
    """Refuses unknown top-level fields instead of ignoring them."""

    body_fields = ()

    def validated(self, serializer_class):
        data = self.request.data
        if not isinstance(data, dict):
            raise InvalidInput("the body must be a JSON object", code=INVALID_REQUEST)
        unknown = sorted(set(data) - set(serializer_class().fields) - set(self.body_fields))
        if unknown:
            code = UNSUPPORTED if set(unknown) & set(ROOM_FIELDS) else INVALID_REQUEST
            raise InvalidInput(f"unknown field(s) {unknown}", code=code)
        return super().validated(serializer_class)


class ProducerWriteView(StrictBodyView):
    """``POST /v1/producers/write``: one sequenced write of a foreign producer."""

    required_scope = "produce"

    @extend_schema(
        operation_id="rindle_producer_write",
        summary="Apply a producer's sequenced write exactly once",
        description=(
            "Applied only at stored seq + 1, with the offset upsert in the same transaction. "
            "A replay (seq <= stored) is absorbed (`applied: false`); a replay of the stored "
            "seq with another payload is 409 `digest_conflict`; a gap is 409 `seq_gap` with "
            "`stored`; another principal's producer id is 403 `producer_not_owned`."
        ),
        request=ProducerWriteRequest,
        responses={200: ProducerWriteResponse, **_errors(400, 401, 403, 409, 503)},
    )
    def post(self, request):
        data = self.validated(ProducerWriteRequest)
        result = get_engine().producer_write(
            data["producer"], data["seq"], data["changes"], owner=principal(request)
        )
        return Response({"applied": result.applied, "seq": result.seq, "cv": result.cv})


class ProducerSeqView(MachineView):
    """``GET /v1/producers/<producer>``: the producer's durable last seq."""

    required_scope = "produce"

    @extend_schema(
        operation_id="rindle_producer_seq",
        summary="A producer's stored seq",
        responses={200: ProducerSeqResponse, **_errors(401, 403)},
    )
    def get(self, request, producer):
        seq = get_engine().producer_seq(producer, owner=principal(request))
        return Response({"producer": producer, "seq": seq})


def _batch(data, source):
    try:
        result = get_engine().apply_source_batch(
            source,
            data["offset"],
            data["changes"],
            chunk_seq=data["chunk_seq"],
            run_id=data["run_id"],
            batch_hash=data["batchHash"],
            head=data["head"],
        )
    except SourceHashMismatch as exc:
        # Loud: the source replayed different content under an applied identity.
        logger.error("rindle ingest: %s", exc.message)
        raise
    return Response(
        {"applied": result.applied, "cv": result.cv, "checkpoint": result.checkpoint.as_dict()}
    )


_BATCH_DOC = (
    "Effects and the source's cursor commit in ONE transaction. `(offset, chunk_seq)` at or "
    "below the stored position answers `applied: false` and writes nothing; the stored "
    "position with another `batchHash` is 409 `hash_mismatch`; a batch whose `run_id` is not "
    "the stored one is 409 `fenced`. Offsets of digits compare as numbers, others as strings."
)


def _batch_schema(operation_id, request):
    """The schema of both batch routes: one operation, the source in the body or the path."""
    return extend_schema(
        operation_id=operation_id,
        summary="Apply a change-source batch with its cursor",
        description=_BATCH_DOC,
        request=request,
        responses={200: SourceBatchResponse, **_errors(400, 401, 403, 409, 503)},
    )


class ApplyRowChangeTxnView(StrictBodyView):
    """``POST /apply-row-change-txn``: one change-source batch (the original's route)."""

    required_scope = "ingest"

    @_batch_schema("rindle_apply_row_change_txn", SourceBatchRequest)
    def post(self, request):
        data = self.validated(SourceBatchRequest)
        return _batch(data, data["source"])


class SourceBatchView(StrictBodyView):
    """``POST /v1/sources/<source>/batches``: the same, the source named by the path."""

    required_scope = "ingest"

    @_batch_schema("rindle_source_batch", SourceBatchBody)
    def post(self, request, source):
        return _batch(self.validated(SourceBatchBody), source)


class SourceCheckpointView(MachineView):
    """``GET /v1/sources/<source>/checkpoint``: where a source resumes."""

    required_scope = "ingest"

    @extend_schema(
        operation_id="rindle_source_checkpoint",
        summary="A change source's stored checkpoint",
        responses={200: CheckpointSerializer, **_errors(401, 403, 404)},
    )
    def get(self, request, source):
        cp = get_engine().source_checkpoint(source)
        if cp is None:
            raise NotFound(f"source {source!r} has no checkpoint")
        return Response(cp.as_dict())


class SourceRunIdView(StrictBodyView):
    """``POST /v1/sources/<source>/run-id``: move the run fence (compare-and-swap)."""

    required_scope = "ingest"

    @extend_schema(
        operation_id="rindle_source_run_id",
        summary="Swap a source's run id at an unchanged cursor",
        request=RunIdRequest,
        responses={200: CheckpointSerializer, **_errors(400, 401, 403, 409, 503)},
    )
    def post(self, request, source):
        data = self.validated(RunIdRequest)
        cp = get_engine().refresh_follower_run_id(
            source, data["offset"], data["previous"], data["next"]
        )
        return Response(cp.as_dict())
