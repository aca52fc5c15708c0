"""The ``partialdef`` and ``partial`` template tags from wherever this Django keeps them: its
own built-ins from Django 6.0, the ``django-template-partials`` package on Django 5.2.

Every dashboard template that defines a partial loads this library (``{% load tenure_partials
%}``), so one template serves both: on Django 6 nothing of the package is imported (it need not
be installed), and on Django 5.2 its app's loader resolves ``"page.html#name"``.
"""

from __future__ import annotations

from importlib import import_module

import django
from django import template

register = template.Library()

# Django 5.2: the package Django 6 absorbed (INSTALLED_APPS "template_partials").
_source = import_module(
    "django.template.defaulttags"
    if django.VERSION >= (6, 0)
    else "template_partials.templatetags.partials"
)
register.tag("partialdef", _source.partialdef_func)
register.tag("partial", _source.partial_func)
