"""Helpers of the plane URLconfs."""

from django.urls import path


def under(prefix, *routes):
    """Flat routes ``(suffix, view class, name)`` under one prefix (each its own URLPattern)."""
    return [path(prefix + suffix, view.as_view(), name=name) for suffix, view, name in routes]
