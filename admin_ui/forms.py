"""Validated input: job-list filters and the fields every action must carry."""

from __future__ import annotations

from typing import Any

from django import forms

from scheduler_core.domain import payload_search
from scheduler_core.domain.reasons import REASON_MAX_CHARS, TOO_LONG
from scheduler_core.domain.states import State
from scheduler_core.read.jobs import HEALTH_FILTERS, PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX, JobFilter

BIGINT_MAX = 2**63 - 1


class ReasonField(forms.CharField):
    """An operator's reason: at most ``REASON_MAX_CHARS`` characters, refused with a message
    when longer. The text area carries no ``maxlength``: a browser would cut a pasted reason
    silently; the form says so instead and keeps what was typed."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 3}))
        kwargs.setdefault("error_messages", {"max_length": TOO_LONG})
        super().__init__(max_length=REASON_MAX_CHARS, **kwargs)

    def widget_attrs(self, widget: forms.Widget) -> dict[str, Any]:
        attrs = super().widget_attrs(widget)
        attrs.pop("maxlength", None)
        attrs["data-max-chars"] = str(REASON_MAX_CHARS)
        return attrs


def _choices(values: Any) -> list[tuple[str, str]]:
    return [("", "any")] + [(v, v.replace("_", " ")) for v in values]


class JobFilterForm(forms.Form):
    """Job-list query parameters. Out-of-range page sizes are clamped, malformed ones refused."""

    state = forms.ChoiceField(choices=_choices(s.value for s in State), required=False)
    health = forms.ChoiceField(choices=_choices(HEALTH_FILTERS), required=False)
    queue = forms.CharField(
        max_length=100, required=False, widget=forms.TextInput(attrs={"list": "known-queues"})
    )
    name = forms.CharField(
        max_length=200,
        required=False,
        label="Job type",
        widget=forms.TextInput(attrs={"list": "known-types"}),
    )
    q = forms.CharField(
        max_length=300, required=False, label="Id, unique key or payload", strip=True
    )
    workflow = forms.IntegerField(min_value=1, max_value=BIGINT_MAX, required=False)
    before = forms.IntegerField(min_value=1, max_value=BIGINT_MAX, required=False)
    limit = forms.IntegerField(required=False)

    def clean_q(self) -> str:
        """A payload search (``{"invoice_id": 1005}``, ``customer.email=a@b.c``) must parse;
        any other text is an id or part of a unique key."""
        q = str(self.cleaned_data.get("q") or "")
        if payload_search.looks_like_payload_query(q):
            try:
                payload_search.parse(q)
            except payload_search.PayloadQueryError as e:
                raise forms.ValidationError(f"Payload search: {e}") from None
        return q

    def clean_limit(self) -> int:
        value = self.cleaned_data.get("limit")
        if value is None:
            return PAGE_SIZE_DEFAULT
        return max(1, min(int(value), PAGE_SIZE_MAX))

    def job_filter(self) -> JobFilter:
        """The filter part of the cleaned data (call after ``is_valid``)."""
        d = self.cleaned_data
        return JobFilter(
            state=d["state"],
            health=d["health"],
            queue=d["queue"],
            name=d["name"],
            q=d["q"],
            workflow=str(d["workflow"] or ""),
        )


EFFECT_NAME_MAX = 100
"""``Effect.name``'s length."""


class EffectNamesField(forms.MultipleChoiceField):
    """The effects an operator ticked, by name (a list; every name a short string).

    Which names are unsettled is the store's to judge, inside the write and after the version
    check: a stale page is a 409 there, never a choice error here.
    """

    widget = forms.CheckboxSelectMultiple

    def valid_value(self, value: Any) -> bool:
        return isinstance(value, str) and 0 < len(value) <= EFFECT_NAME_MAX and "\x00" not in value


class ActionForm(forms.Form):
    """What every action on one job carries: the version seen, a reason, a confirmation; for
    a stated fact, the effects it is about and, with an earlier owner that may still be in
    flight, the operator's acceptance of that."""

    version = forms.IntegerField(min_value=0, max_value=2**31 - 1, widget=forms.HiddenInput)
    seen_state = forms.CharField(required=False, max_length=16, widget=forms.HiddenInput)
    """The state the operator read, so a refusal can say what it became."""
    reason = ReasonField()
    confirm = forms.BooleanField(
        required=True,
        error_messages={"required": "Tick the box to confirm what this action does."},
    )
    effects = EffectNamesField(required=False)
    accept_in_flight = forms.BooleanField(required=False)
    seen_owners = forms.RegexField(
        regex=r"^[0-9]{1,19}(,[0-9]{1,19}){0,49}$|^$",
        required=False,
        widget=forms.HiddenInput,
        error_messages={"invalid": "The confirmation's list of owners is malformed; reload."},
    )
    """The fences of the earlier owners the confirmation showed as possibly in flight: the
    store refuses the action when those have changed since."""

    def seen_fences(self) -> list[int]:
        """The fences :attr:`seen_owners` names (empty when none, or not yet valid)."""
        raw = self.data.get("seen_owners", "") if self.is_bound else ""
        return [int(f) for f in str(raw).split(",") if f.isdigit()]

    def clean_reason(self) -> str:
        reason = str(self.cleaned_data["reason"]).strip()
        if not reason:
            raise forms.ValidationError("Say why.")
        return reason

    def clean_effects(self) -> list[str]:
        """The ticked names in order, each once."""
        return list(dict.fromkeys(self.cleaned_data.get("effects") or []))


class BulkActionForm(ActionForm):
    """A bulk action: the count confirmed replaces the single version."""

    version = None  # type: ignore[assignment]
    seen_state = None  # type: ignore[assignment]
    effects = None  # type: ignore[assignment]
    accept_in_flight = None  # type: ignore[assignment]
    seen_owners = None  # type: ignore[assignment]
    confirmed_count = forms.IntegerField(
        min_value=0, max_value=BIGINT_MAX, label="Type the number of jobs to confirm"
    )
    shown_count = forms.IntegerField(min_value=0, max_value=BIGINT_MAX, required=False)
    """The count the confirmation showed, so a typo is told apart from a change."""
