"""The demo's sign-in: demo mode only, and never as staff, a superuser or a real account."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db

DEMO = override_settings(RINDLE_DEMO_OPEN_SIGN_IN=True)


def sign_in(username):
    client = Client()
    response = client.post("/signin/", {"username": username, "next": "/board/"})
    return response, client.session.get("_auth_user_id")


def test_outside_demo_mode_the_sign_in_does_not_exist():
    """The project runs with DEBUG off (pytest-django too): /signin/ is a 404."""
    assert Client().get("/signin/").status_code == 404
    response, who = sign_in("ada")
    assert (response.status_code, who) == (404, None)
    assert not get_user_model().objects.filter(username="ada").exists()
    with override_settings(DEBUG=True):  # demo mode: DEBUG on, as `make demo` runs
        assert Client().get("/signin/").status_code == 200


@DEMO
def test_in_demo_mode_a_name_signs_in_a_demo_user():
    response, who = sign_in("ada")
    assert (response.status_code, response["Location"]) == (302, "/board/")
    ada = get_user_model().objects.get(username="ada")
    assert who == str(ada.pk) and not ada.has_usable_password()
    response, again = sign_in("ada")
    assert (response.status_code, again) == (302, who)


ACCOUNTS = {
    "superuser": lambda m: m.objects.create_superuser("root", password="pw"),
    "superuser without a password": lambda m: m.objects.create_superuser("root", password=None),
    "staff": lambda m: m.objects.create_user("root", is_staff=True),
    "inactive": lambda m: m.objects.create_user("root", is_active=False),
    "a real account with a password": lambda m: m.objects.create_user("root", password="pw"),
}


@DEMO
@pytest.mark.parametrize("make", ACCOUNTS.values(), ids=ACCOUNTS.keys())
def test_the_demo_sign_in_never_signs_in_a_real_account(make):
    make(get_user_model())
    response, who = sign_in("root")
    assert (response.status_code, who) == (403, None)
    assert b"real account" in response.content
