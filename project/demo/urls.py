"""Routes of the demo pages."""

from django.urls import path

from . import views

urlpatterns = [
    path("", views.index, name="demo-index"),
    path("board/", views.board, name="demo-board"),
    path("issues/new/", views.new_issue, name="demo-new"),
    path("issues/<str:issue_id>/", views.issue, name="demo-issue"),
    path("signin/", views.sign_in, name="demo-signin"),
    path("signout/", views.sign_out, name="demo-signout"),
]
