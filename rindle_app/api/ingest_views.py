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
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from ..engine import get_engine
from ..engine.errors import InvalidInput
from ..engine.sources import SourceHashMismatch
from ..exceptions import (
    INSUFFICIENT_SCOPE,
    INVALID_REQUEST,
    UNAUTHORIZED,
    NotFound,
    RoomConflict,
    RoomFenced,
)
from ..room_credentials import RoomCredential
from .auth import RoomCredentialAuthentication
from .permissions import TokenWithScope
from .serializers import ErrorResponse, StrictBooleanField, StrictCharField, StrictIntegerField
from .views import RindleView

logger = logging.getLogger("rindle.api")

MAX_SEQ = 2**63 - 1


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


class RowChangeTxnRequest(SourceBatchRequest):
    """The original's batch: a change-source batch, or with ``doc`` a room flush."""

    doc = StrictCharField(
        max_length=255,
        trim_whitespace=False,
        required=False,
        default=None,
        help_text="The room this flush belongs to (token scope `rooms`).",
    )
    epoch = StrictIntegerField(
        min_value=1,
        max_value=MAX_SEQ,
        required=False,
        default=None,
        help_text="The placement epoch the flushing host claimed: a stale one is 409 fenced.",
    )
    cas = StrictBooleanField(
        required=False,
        default=False,
        help_text="Check every change's old image (an add: the key's absence) first.",
    )


class RoomDocRequest(serializers.Serializer):
    doc = StrictCharField(max_length=255, trim_whitespace=False)


class RoomEpochResponse(serializers.Serializer):
    epoch = serializers.IntegerField()


class RoomLmidsRequest(serializers.Serializer):
    doc = StrictCharField(max_length=255, trim_whitespace=False)
    clients = serializers.ListField(child=StrictCharField(max_length=255, trim_whitespace=False))


class RoomLmidsResponse(serializers.Serializer):
    lmids = serializers.DictField(
        child=serializers.IntegerField(), help_text="Clients without a room lmid are absent (0)."
    )


class RoomVerdictResponse(serializers.Serializer):
    error = serializers.ChoiceField(choices=["fenced", "conflict"])
    message = serializers.CharField()
    epoch = serializers.IntegerField(required=False, allow_null=True)
    conflicts = serializers.ListField(child=serializers.DictField(), required=False)


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
            raise InvalidInput(f"unknown field(s) {unknown}", code=INVALID_REQUEST)
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


_ROOM_DOC = (
    "With `doc` (and its `epoch`) the batch is a room flush and the token needs scope "
    '`rooms`: an epoch that is not the doc\'s current one is 409 `{error: "fenced", epoch}`; '
    "with `cas: true` a change whose old image (an add: the key's absence) is not the current "
    'row rolls the whole batch back, 409 `{error: "conflict", conflicts}` with each current '
    "image. Changes to `_rindle_client_mutations` go to the room ledger under `doc`, never "
    "to the slow-path ledger; `_rindle_room_mutation_outcomes` rows record mutations that "
    "were not applied. Those two verdicts answer the daemon's own body shape, which room "
    "hosts decode."
)


def room_verdict(exc):
    """The daemon's body of a room verdict: ``{error: "fenced"|"conflict", ...}``."""
    details = {k: v for k, v in exc.details.items() if k != "code"}
    return Response({"error": exc.code, "message": exc.message, **details}, status=exc.status)


class RoomView(StrictBodyView):
    """The room write authority: token scope ``rooms``."""

    required_scope = "rooms"


class FlushAuthenticated:
    """
    A room flush route: it also takes the flush credential ``/room-boot`` hands out
    (``rindle_app.room_credentials``), for its doc and epoch only (``bind``).
    """

    def get_authenticators(self):
        return [RoomCredentialAuthentication(), *super().get_authenticators()]

    def bind(self, doc, epoch=None):
        """Refuse (403) a flush credential's request on another doc or an earlier epoch."""
        credential = self.request.auth
        if isinstance(credential, RoomCredential) and not credential.allows(doc, epoch):
            raise PermissionDenied(
                f"this room flush credential is for doc {credential.doc!r} from epoch "
                f"{credential.epoch} on",
                code=UNAUTHORIZED,
            )


class ApplyRowChangeTxnView(FlushAuthenticated, StrictBodyView):
    """
    ``POST /apply-row-change-txn``: one change-source batch, or a room flush when it
    carries a ``doc`` (the original's route; the daemon client's ``applyRowChangeTxn``).
    """

    # Checked in ``post``, once the body says which plane this is: a change-source batch
    # takes ``ingest``, a room flush ``rooms``.
    required_scope = None

    @extend_schema(
        operation_id="rindle_apply_row_change_txn",
        summary="Apply a change-source batch or a room flush with its cursor",
        description=f"{_BATCH_DOC} {_ROOM_DOC}",
        request=RowChangeTxnRequest,
        responses={
            200: SourceBatchResponse,
            409: OpenApiResponse(RoomVerdictResponse),
            **_errors(400, 401, 403, 503),
        },
    )
    def post(self, request):
        data = self.validated(RowChangeTxnRequest)
        room = data["doc"] is not None or data["epoch"] is not None or data["cas"]
        scope = "rooms" if room else "ingest"
        if not request.auth.has_scope(scope):
            what = "a room flush (doc, epoch or cas)" if room else "a change-source batch"
            raise PermissionDenied(
                f"{what} takes a token with scope {scope!r}", code=INSUFFICIENT_SCOPE
            )
        if not room:
            return _batch(data, data["source"])
        if data["chunk_seq"] != -1 or data["run_id"] is not None or data["head"] is not None:
            raise InvalidInput(
                "a room flush is a whole batch: no chunk_seq, run_id or head",
                code=INVALID_REQUEST,
            )
        self.bind(data["doc"], data["epoch"])
        try:
            result = get_engine().commit_room_flush(
                data["changes"],
                data["source"],
                data["offset"],
                doc=data["doc"],
                epoch=data["epoch"],
                batch_hash=data["batchHash"],
                cas=data["cas"],
            )
        except (RoomFenced, RoomConflict) as exc:
            return room_verdict(exc)
        except SourceHashMismatch as exc:
            logger.error("rindle rooms: %s", exc.message)
            raise
        return Response(
            {"applied": result.applied, "cv": result.cv, "checkpoint": result.checkpoint.as_dict()}
        )


class ClaimRoomEpochView(FlushAuthenticated, RoomView):
    """``POST /claim-room-epoch {doc}`` → ``{epoch}``: the next placement epoch."""

    @extend_schema(
        operation_id="rindle_claim_room_epoch",
        summary="Claim a room's next placement epoch",
        description=(
            "One write transaction, one monotone bump (1 for a first claim): every flush "
            "carrying an earlier epoch is fenced from now on."
        ),
        request=RoomDocRequest,
        responses={200: RoomEpochResponse, **_errors(400, 401, 403, 503)},
    )
    def post(self, request):
        data = self.validated(RoomDocRequest)
        self.bind(data["doc"])
        return Response({"epoch": get_engine().claim_room_epoch(data["doc"])})


class RoomLmidsView(FlushAuthenticated, RoomView):
    """``POST /room-lmids {doc, clients}`` → ``{lmids}``: the room's boot probe."""

    @extend_schema(
        operation_id="rindle_room_lmids",
        summary="The room ledger's lmid per client",
        description=(
            "Reads `_rindle_room_client_mutations` under `doc` (never the slow-path ledger), "
            "so a rebooted room absorbs mutations that are already durable."
        ),
        request=RoomLmidsRequest,
        responses={200: RoomLmidsResponse, **_errors(400, 401, 403)},
    )
    def post(self, request):
        data = self.validated(RoomLmidsRequest)
        self.bind(data["doc"])
        return Response({"lmids": get_engine().room_lmids(data["doc"], data["clients"])})


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
