"""The demo issue tracker (the original rindle example, ported to Django)."""

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "project.demo"
    label = "demo"
    verbose_name = "Demo issue tracker"
    default_auto_field = "django.db.models.BigAutoField"
