"""
Pages of the demo issue tracker.

Each page is a template plus a small ES module (``rindle_app/static/rindle/rindle.js``)
that subscribes to the demo's named queries over ``/ws/rindle/`` and sends its
mutators; nothing is rendered from the database here. Who acts is the Django
session user: the demo's sign-in asks for a name only, creates the Django user on
first use and logs in, so anyone can act as anyone. That is the point of a demo and
the reason it is open only in demo mode: while ``DEBUG`` is on (``make demo``), or
where ``RINDLE_DEMO_OPEN_SIGN_IN`` says so; elsewhere it is a 404. It never signs in
an account that is more than a demo user: staff, superusers, inactive users and
anyone with a password are refused.
"""

import re

from django.conf import settings
from django.contrib.auth import get_user_model, login, logout
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from .models import PRIORITIES, STATUSES, User

# Demo user ids become issue owners and comment authors (at most 40 characters).
USERNAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


def _page(request, template, **context):
    user = request.user
    context.update(
        statuses=STATUSES,
        priorities=PRIORITIES,
        me=user.username if user.is_authenticated else None,
    )
    return render(request, template, context)


def index(request):
    return _page(request, "demo/list.html")


def board(request):
    return _page(request, "demo/board.html")


def issue(request, issue_id):
    return _page(request, "demo/issue.html", issue_id=issue_id)


def new_issue(request):
    return _page(request, "demo/new.html")


def _open_sign_in():
    return getattr(settings, "RINDLE_DEMO_OPEN_SIGN_IN", settings.DEBUG)


def _demo_account(user):
    """Only a plain, active account with no password is a demo user."""
    return (
        user.is_active
        and not user.is_staff
        and not user.is_superuser
        and not user.has_usable_password()
    )


def _next_url(request, value):
    if value and url_has_allowed_host_and_scheme(value, {request.get_host()}):
        return value
    return "/"


def sign_in(request):
    """Act as a demo user: a name, no password (only while the demo sign-in is open)."""
    if not _open_sign_in():
        raise Http404("the demo sign-in is closed")
    next_url = _next_url(request, request.POST.get("next") or request.GET.get("next"))
    error, status = None, 200
    if request.method == "POST":
        username = (request.POST.get("username") or "").strip().lower()
        if USERNAME.match(username) and username != "unassigned":
            user, created = get_user_model().objects.get_or_create(username=username)
            if created:
                user.set_unusable_password()
                user.save(update_fields=["password"])
            if _demo_account(user):
                login(request, user, backend="django.contrib.auth.backends.ModelBackend")
                return redirect(next_url)
            error = f"{username!r} is a real account; the demo sign-in cannot act as it."
            status = 403
        else:
            error = "Use 1 to 40 lower-case letters, digits, '-' or '_' (and not 'unassigned')."
    people = User.objects.exclude(id="unassigned").order_by("name")[:40]
    response = _page(request, "demo/signin.html", people=people, next=next_url, error=error)
    response.status_code = status
    return response


@require_POST
def sign_out(request):
    logout(request)
    return redirect(_next_url(request, request.POST.get("next")))
