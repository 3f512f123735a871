"""Which Django models are synced: ``RINDLE["SYNCED_MODELS"]`` plus ``@synced``."""

from django.apps import apps

from ..conf import rindle_settings

_decorated = []


def synced(model):
    """Class decorator: sync this model's table (capture + live queries)."""
    _decorated.append(model._meta.label)
    return model


def synced_labels():
    return list(dict.fromkeys([*rindle_settings.SYNCED_MODELS, *_decorated]))


def synced_models():
    """The synced model classes; an unknown label raises LookupError."""
    return [apps.get_model(label) for label in synced_labels()]
