"""
Bookkeeping tables of the engine, one model per ``_rindle_*`` table, and the API
tokens of machine clients.

Django owns their DDL through migrations; the engine reads and writes its tables
with plain SQL on its writer connection. The admin shows them read-only.
"""

from django.conf import settings
from django.db import models
from django.db.models.functions import Now
from django.utils import timezone


class ChangeEvent(models.Model):
    """
    The outbox: one row per captured row change, appended by a trigger in the
    same transaction as the change itself.

    ``seq`` is monotone and never reused; ``txid`` is the Postgres transaction id
    (null on SQLite, whose writers are serialized so a reader's snapshot always
    holds whole transactions).
    """

    seq = models.BigAutoField(primary_key=True)
    txid = models.BigIntegerField(null=True)
    table = models.TextField()
    op = models.CharField(max_length=8)  # add | edit | remove | ddl (a schema change marker)
    key = models.JSONField(db_column="pk")  # the row's primary key values
    old = models.JSONField(null=True)
    new = models.JSONField(null=True)
    # When the row was captured (the database clock, at its transaction's start on
    # PostgreSQL): what retention's age is measured against. Never an order: seq is.
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "_rindle_change_events"
        verbose_name = "change event"

    def __str__(self):
        return f"#{self.seq} {self.op} {self.table} {self.key}"


class ClientMutation(models.Model):
    """The last mutation id applied (or rejected) per client: the lmid."""

    client_id = models.TextField(primary_key=True)
    last_mutation_id = models.BigIntegerField()
    # The principal key the client id is bound to (``engine.mutations.principal_key``):
    # its first write claims it; null: not claimed yet. Never sent to a client.
    owner = models.TextField(null=True)

    class Meta:
        db_table = "_rindle_client_mutations"
        verbose_name = "client lmid"

    def __str__(self):
        return f"{self.client_id} @ {self.last_mutation_id}"


class ProducerOffset(models.Model):
    """The last sequence a foreign producer wrote, and the digest of that write."""

    producer = models.TextField(primary_key=True)
    seq = models.BigIntegerField()
    digest = models.TextField(null=True)
    # The principal (user pk, as text) the producer id is bound to: the first
    # write claims the id, and nobody else may write as it.
    owner = models.TextField(null=True)

    class Meta:
        db_table = "_rindle_producer_offsets"

    def __str__(self):
        return f"{self.producer} @ {self.seq}"


class SourceOffset(models.Model):
    """A change source's durable cursor, committed with the effects it covers."""

    source = models.TextField(primary_key=True)
    offset = models.TextField()
    chunk_seq = models.BigIntegerField(default=-1)  # -1: a whole-run checkpoint
    run_id = models.TextField(null=True)
    batch_hash = models.TextField(null=True)
    head = models.JSONField(null=True)

    class Meta:
        db_table = "_rindle_source_offsets"

    def __str__(self):
        return f"{self.source} @ {self.offset}/{self.chunk_seq}"


class AppliedDdl(models.Model):
    """The DDL journal: one row per applied migration, with its apply report."""

    key = models.TextField(primary_key=True)
    actions = models.JSONField(null=True)
    checksum = models.TextField(null=True)
    content_checksum = models.TextField(null=True)
    applied_at = models.BigIntegerField()  # milliseconds since the epoch

    class Meta:
        db_table = "_rindle_applied_ddl"
        verbose_name = "applied DDL"

    def __str__(self):
        return self.key


class SqlOutcome(models.Model):
    """The retained terminal outcome of a public SQL operation, for replay."""

    outcome_key = models.TextField(primary_key=True)
    result = models.TextField()
    expires_at = models.BigIntegerField()  # milliseconds since the epoch

    class Meta:
        db_table = "_rindle_sql_outcomes"

    def __str__(self):
        return self.outcome_key


class RoomPlacement(models.Model):
    """A room document's placement epoch; each claim bumps it once."""

    doc = models.TextField(primary_key=True)
    epoch = models.BigIntegerField()
    # The channel of the process whose room holds the epoch (rooms route a doc's
    # sockets there: realtime.room_router); empty for a claim made over HTTP.
    host = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "_rindle_room_placement"

    def __str__(self):
        return f"{self.doc} epoch {self.epoch}"


class RoomClientMutation(models.Model):
    """The room ledger: lmid per (doc, client), never aliasing the client ledger."""

    pk = models.CompositePrimaryKey("doc", "client_id")
    doc = models.TextField()
    client_id = models.TextField()
    last_mutation_id = models.BigIntegerField()

    class Meta:
        db_table = "_rindle_room_client_mutations"

    def __str__(self):
        return f"{self.doc}/{self.client_id} @ {self.last_mutation_id}"


class RoomWatermark(models.Model):
    """The downgrade fence: the last flush sequence committed for a room."""

    doc = models.TextField(primary_key=True)
    flush_seq = models.TextField()

    class Meta:
        db_table = "_rindle_room_watermark"

    def __str__(self):
        return f"{self.doc} @ {self.flush_seq}"


class RoomMutationOutcome(models.Model):
    """Outcome of a room mutation that was NOT applied (absent under lmid = applied)."""

    pk = models.CompositePrimaryKey("doc", "client_id", "mid")
    doc = models.TextField()
    client_id = models.TextField()
    mid = models.BigIntegerField()
    kind = models.TextField()
    reason = models.TextField(null=True)
    name = models.TextField(null=True)
    args = models.JSONField(null=True)

    class Meta:
        db_table = "_rindle_room_mutation_outcomes"

    def __str__(self):
        return f"{self.doc}/{self.client_id}#{self.mid} {self.kind}"


class ScopeSession(models.Model):
    """Room occupancy (the doorbell): one row per client present in a scope."""

    pk = models.CompositePrimaryKey("scope", "client_id")
    scope = models.TextField()
    client_id = models.TextField()
    expires_at = models.BigIntegerField()  # milliseconds since the epoch

    class Meta:
        db_table = "_rindle_scope_sessions"

    def __str__(self):
        return f"{self.scope}/{self.client_id}"


# --- access -----------------------------------------------------------------------


class RindleToken(models.Model):
    """
    A scoped bearer token of a machine client (see ``rindle_app.tokens``).

    Only the token's ``prefix`` (its public, looked-up part) and the SHA-256
    ``digest`` of the whole token are stored; the raw token is shown once, when it
    is created, and cannot be recovered.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="rindle_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    # Tables public SQL with this token may write (the ``sql`` scope); empty: none.
    tables = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "_rindle_tokens"
        verbose_name = "API token"
        ordering = ["-created_at"]

    def __str__(self):
        return f"rdl_{self.prefix}_… ({self.name or self.user})"

    def is_active(self, now=None):
        """Neither revoked nor expired (at ``now``, default the current time)."""
        now = now or timezone.now()
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > now

    # The original's database token is ONE token for the whole control plane: its
    # routes include the room and change-source ones, and its leases are subscribed.
    IMPLIED_SCOPES = {"daemon": ("read", "schema", "ingest", "rooms")}

    def has_scope(self, scope):
        """Whether the token grants ``scope``; ``"admin"`` grants every scope."""
        scopes = self.scopes if isinstance(self.scopes, list) else []
        if scope in scopes or "admin" in scopes:
            return True
        return any(scope in self.IMPLIED_SCOPES.get(s, ()) for s in scopes)


# --- usage ledger -------------------------------------------------------------------


class FlowDayRecord(models.Model):
    """
    The kept half of the usage ledger (``rindle_app.flow``): one node's copy of one
    namespace's flow over one UTC day.

    Each process (node) writes only its own rows, by copy, so nodes flushing the
    same namespace and day never overwrite each other; readers sum the nodes.
    ``sessions`` is a JSON list, the node's sketch of distinct session ids (see
    ``rindle_app.flow.sessions``), merged across nodes at read.
    """

    pk = models.CompositePrimaryKey("namespace", "day", "node")
    namespace = models.TextField()
    day = models.IntegerField()  # UTC days since 1970-01-01
    node = models.TextField()
    bytes_in = models.BigIntegerField(default=0)
    bytes_out = models.BigIntegerField(default=0)
    # Bulk payload bytes, already inside bytes_in / bytes_out.
    bulk_bytes_in = models.BigIntegerField(default=0)
    bulk_bytes_out = models.BigIntegerField(default=0)
    transfers = models.BigIntegerField(default=0)
    # Refusals by reason (rindle_app.flow.Refusal).
    refused_rate_limit = models.BigIntegerField(default=0)
    refused_quota = models.BigIntegerField(default=0)
    refused_permission = models.BigIntegerField(default=0)
    refused_fenced = models.BigIntegerField(default=0)
    refused_too_large = models.BigIntegerField(default=0)
    refused_bad_request = models.BigIntegerField(default=0)
    refused_unavailable = models.BigIntegerField(default=0)
    refused_other = models.BigIntegerField(default=0)
    auth_failures = models.BigIntegerField(default=0)
    sessions = models.TextField(default="[]")
    last_seen_ms = models.BigIntegerField(default=0)  # 0: no transfer or refusal

    class Meta:
        db_table = "_rindle_flow_days"
        verbose_name = "flow day"
        indexes = [models.Index(fields=["day"], name="rindle_flow_days_day")]

    def __str__(self):
        return f"{self.namespace} day {self.day} @ {self.node}"


class FlowTombstone(models.Model):
    """
    A forgotten namespace: its generation, bumped by every forget, which flushes
    check so that no process writes a forgotten namespace's figures back.
    """

    namespace = models.TextField(primary_key=True)
    generation = models.BigIntegerField()
    seq = models.BigIntegerField(unique=True)  # the order of forgets, for incremental reads
    forgotten_ms = models.BigIntegerField()

    class Meta:
        db_table = "_rindle_flow_forgotten"
        verbose_name = "forgotten flow namespace"

    def __str__(self):
        return f"{self.namespace} generation {self.generation}"


class Usage(FlowTombstone):
    """
    The admin index's "Usage" entry, whose changelist is the usage ledger's fleet
    page. A proxy with no table of its own: the admin lists models only, and the
    ledger's kept rows (``FlowDayRecord``) have a composite key it cannot register.
    """

    class Meta:
        proxy = True
        verbose_name = "usage"
        verbose_name_plural = "usage"


class StreamState(models.Model):
    """
    One change stream over the outbox (``stream.state``): how far readers may go,
    and how far back they still can.

    - ``safe_seq``: every outbox seq at or below it is committed or gone for good
      (published by the watermarker on PostgreSQL; never decreases).
    - ``horizon``: the first seq retention kept; a reader whose next seq is below it
      must resnapshot (never moves back, never passes ``safe_seq + 1``).
    - ``epoch``: names this stream's sequence numbers. It changes when the database
      is restored, so an old cursor cannot alias new rows.
    """

    name = models.TextField(primary_key=True)
    epoch = models.TextField()
    safe_seq = models.BigIntegerField(default=0)
    horizon = models.BigIntegerField(default=1)
    # The database clock when safe_seq last moved, and when it was last confirmed.
    advanced_at = models.DateTimeField(null=True)
    checked_at = models.DateTimeField(null=True)
    # What the epoch was minted for (database identity); a mismatch mints a new one.
    identity = models.TextField(default="")

    class Meta:
        db_table = "_rindle_stream"
        verbose_name = "change stream"

    def __str__(self):
        return f"{self.name} safe {self.safe_seq} horizon {self.horizon} epoch {self.epoch}"


class StreamLease(models.Model):
    """
    A singleton lease (the watermarker's, retention's) decided on the database
    clock. ``epoch`` is the fencing token: it grows by one on every change of holder,
    and each write the holder makes re-checks it.
    """

    name = models.TextField(primary_key=True)
    holder = models.TextField(default="")
    epoch = models.BigIntegerField(default=0)
    acquired_at = models.DateTimeField(null=True)
    renewed_at = models.DateTimeField(null=True)
    expires_at = models.DateTimeField(null=True)
    transitions = models.BigIntegerField(default=0)

    class Meta:
        db_table = "_rindle_stream_leases"
        verbose_name = "stream lease"

    def __str__(self):
        return f"{self.name} held by {self.holder or '-'} (epoch {self.epoch})"
