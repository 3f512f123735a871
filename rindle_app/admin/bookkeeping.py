"""Admins of the engine's bookkeeping tables: client, producer and source offsets, DDL, outcomes."""

from django.contrib import admin

from .. import models
from .base import ReadOnlyAdmin, epoch_ms


@admin.register(models.ClientMutation)
class ClientMutationAdmin(ReadOnlyAdmin):
    list_display = ("client_id", "last_mutation_id")
    search_fields = ("client_id",)
    ordering = ("client_id",)


@admin.register(models.ProducerOffset)
class ProducerOffsetAdmin(ReadOnlyAdmin):
    list_display = ("producer", "seq", "digest")
    search_fields = ("producer",)
    ordering = ("producer",)


@admin.register(models.SourceOffset)
class SourceOffsetAdmin(ReadOnlyAdmin):
    list_display = ("source", "offset", "chunk_seq", "run_id", "batch_hash")
    search_fields = ("source", "run_id")
    ordering = ("source",)


@admin.register(models.AppliedDdl)
class AppliedDdlAdmin(ReadOnlyAdmin):
    list_display = ("key", epoch_ms("applied_at", "applied at"), "checksum")
    search_fields = ("key",)
    ordering = ("-applied_at",)


@admin.register(models.SqlOutcome)
class SqlOutcomeAdmin(ReadOnlyAdmin):
    list_display = ("outcome_key", epoch_ms("expires_at", "expires at"))
    search_fields = ("outcome_key",)
    ordering = ("expires_at",)
