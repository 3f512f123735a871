"""A URLconf with an admin site over a synced model (the project registers none)."""

from django.contrib.admin import AdminSite
from django.urls import path

from project.demo.models import User

site = AdminSite(name="wm_admin")
site.register(User)
urlpatterns = [path("wm-admin/", site.urls)]
