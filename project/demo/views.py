"""Pages of the demo issue tracker."""

from django.shortcuts import render

from .models import Issue


def index(request):
    issues = Issue.objects.select_related("owner").order_by("-created_at", "id")[:50]
    return render(request, "demo/index.html", {"issues": issues, "total": Issue.objects.count()})
