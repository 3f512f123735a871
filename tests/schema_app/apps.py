"""App configuration of the schema-change test app."""

from django.apps import AppConfig


class SchemaAppConfig(AppConfig):
    name = "tests.schema_app"
    label = "schema_app"
    default_auto_field = "django.db.models.BigAutoField"
