"""The issue tracker in the admin: users, issues with their tags and comments."""

from django.contrib import admin
from django.db import models
from django.forms import TextInput

from .models import Comment, Issue, Tag, User

# The demo's short texts (ids, names, titles) are TextFields, like the original's
# columns; a one-line input suits them better than a textarea.
ONE_LINE = {models.TextField: {"widget": TextInput(attrs={"size": 60})}}


@admin.register(User)
class UserAdmin(admin.ModelAdmin):
    formfield_overrides = ONE_LINE
    list_display = ("name", "id")
    search_fields = ("name", "id")
    ordering = ("name",)


class TagInline(admin.TabularInline):
    formfield_overrides = ONE_LINE
    model = Tag
    extra = 0


class CommentInline(admin.StackedInline):
    model = Comment
    extra = 0
    autocomplete_fields = ("author",)
    ordering = ("created_at",)


@admin.register(Issue)
class IssueAdmin(admin.ModelAdmin):
    formfield_overrides = ONE_LINE
    list_display = ("title", "status", "priority", "owner", "id")
    list_filter = ("status", "priority")
    list_select_related = ("owner",)
    search_fields = ("title", "id", "owner__name")
    # The demo's timestamps are epoch milliseconds (the original's columns).
    ordering = ("-created_at",)
    autocomplete_fields = ("owner",)
    inlines = (TagInline, CommentInline)
    list_per_page = 50


@admin.register(Tag)
class TagAdmin(admin.ModelAdmin):
    formfield_overrides = ONE_LINE
    list_display = ("name", "issue")
    list_filter = ("name",)
    list_select_related = ("issue",)
    search_fields = ("name", "issue__title")
    autocomplete_fields = ("issue",)


@admin.register(Comment)
class CommentAdmin(admin.ModelAdmin):
    list_display = ("__str__", "issue", "author")
    list_select_related = ("issue", "author")
    search_fields = ("body", "issue__title", "author__name")
    ordering = ("-created_at",)
    autocomplete_fields = ("issue", "author")
