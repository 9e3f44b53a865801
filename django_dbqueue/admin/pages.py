"""What the app's admin pages share: the context of its own pages (dashboard, schedules,
delete confirmation) with a breadcrumb trail in the markup of the running Django, and
times shown to the second.

Django 6.1 lays breadcrumbs out as ``<ol class="breadcrumbs"><li>…``, earlier versions
as ``<div class="breadcrumbs">… &rsaquo; …``; each version's CSS styles only its own.
The trail is therefore rendered the way the project's ``admin/base.html`` (Django's, or
the project's override of it) renders its own, read from that template once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.options import ModelAdmin
from django.http import HttpRequest
from django.template.loader import get_template
from django.urls import reverse
from django.utils.dateformat import format as format_date
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import capfirst
from django.utils.timezone import is_aware, localtime
from django.utils.translation import gettext

if TYPE_CHECKING:
    _ModelAdmin = ModelAdmin[Any]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = ModelAdmin

# A column shown to the second is the model field's name with this suffix
# (Django's own DATETIME_FORMAT stops at minutes in most locales).
TIME_SUFFIX = "_time"


@cache
def breadcrumbs_as_list() -> bool:
    """Does this project's admin mark breadcrumbs up as a list (Django 6.1 and later)?"""
    template = get_template("admin/base.html")
    source = getattr(getattr(template, "template", None), "source", "")
    return '<ol class="breadcrumbs">' in source


def page_context(
    model_admin: _ModelAdmin, request: HttpRequest, title: str, *trail: tuple[str, str]
) -> dict[str, Any]:
    """The context of one of the app's pages: the admin's own, its title, and the trail
    Home > app > the model's list > ``trail`` (each a url name of this model's admin and
    its label) > ``title``."""
    opts, site = model_admin.opts, model_admin.admin_site.name
    prefix = f"{site}:{opts.app_label}_{opts.model_name}"
    crumbs = [
        (reverse(f"{site}:index"), gettext("Home")),
        (reverse(f"{site}:app_list", args=[opts.app_label]), str(opts.app_config.verbose_name)),
        (reverse(f"{prefix}_changelist"), capfirst(str(opts.verbose_name_plural))),
    ] + [(reverse(f"{prefix}_{name}"), label) for name, label in trail]
    return {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": opts,
        "crumbs": crumbs,
        "crumbs_as_list": breadcrumbs_as_list(),
    }


def exact_time(value: datetime | None) -> str:
    """A time to the second in the current time zone ("-" for none)."""
    if value is None:
        return "-"
    return format_date(localtime(value) if is_aware(value) else value, "Y-m-d H:i:s")


def short_time(value: datetime | None) -> SafeString | str:
    """For lists: the time of day alone when it is today, the whole time on hover (an
    older one may wrap between its date and its time)."""
    if value is None:
        return "-"
    local = localtime(value) if is_aware(value) else value
    today = local.date() == (localtime() if is_aware(value) else datetime.now()).date()
    shown = format_date(local, "H:i:s") if today else exact_time(value)
    return format_html('<span title="{}">{}</span>', exact_time(value), shown)


def time_column(field: str, short: bool = False) -> Callable[[Any, Any], SafeString | str]:
    """A display method showing ``field``, a date and time, to the second (``short``: the
    list's form, :func:`short_time`); name it ``field + TIME_SUFFIX`` on the ModelAdmin."""
    show_time = short_time if short else exact_time

    @admin.display(description=field.replace("_", " "), ordering=field)
    def show(model_admin: Any, obj: Any) -> SafeString | str:
        return show_time(getattr(obj, field))

    return show
