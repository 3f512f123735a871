"""App configuration of rindle."""

from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate
from django.utils.translation import gettext_lazy as _


class RindleConfig(AppConfig):
    name = "rindle_app"
    label = "rindle_app"
    verbose_name = _("rindle")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.utils.module_loading import autodiscover_modules

        from . import (
            checks,  # noqa: F401  (registers the system checks)
            metrics,
        )
        from .conf import rindle_settings
        from .signals import (
            guard_capture_before_migrate,
            install_capture_after_migrate,
            install_sql_sandbox_after_migrate,
        )
        from .stream import local

        autodiscover_modules(rindle_settings.MUTATORS_MODULE)
        autodiscover_modules(rindle_settings.QUERIES_MODULE)
        pre_migrate.connect(guard_capture_before_migrate, sender=self)
        post_migrate.connect(install_capture_after_migrate, sender=self)
        post_migrate.connect(install_sql_sandbox_after_migrate, sender=self)
        metrics.register()
        local.install()
