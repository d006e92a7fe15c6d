"""Kubernetes label keys and values as the API server validates them (apimachinery)."""

from __future__ import annotations

import re

#: A Kubernetes label value (apimachinery ``IsValidLabelValue``): at most 63 characters,
#: alphanumerics and ``-_.``, starting and ending alphanumeric. Taint values are label values.
K8S_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")

#: A Kubernetes label key (apimachinery ``IsQualifiedName``): an optional DNS subdomain prefix of at
#: most 253 characters and ``/``, then a name of at most 63 characters.
_K8S_LABEL_NAME = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?$")


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label key (None when it is one)."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not _DNS_SUBDOMAIN.match(prefix):
        return f"label key {key!r}: the prefix must be a DNS subdomain (lower case, at most 253 characters)"
    if not _K8S_LABEL_NAME.match(name):
        return (
            f"label key {key!r}: the name must be at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def selector_problems(selector: dict[str, str]) -> list[str]:
    """Why a node selector (label key → value, a ``nodeSelector``) is not one; empty when it is."""
    problems = [p for key in selector if (p := label_key_problem(key))]
    problems += [
        f"label value {v!r} of {k!r}: at most 63 letters, digits, '-', '_' or '.', starting and ending "
        "with a letter or digit"
        for k, v in selector.items()
        if not K8S_LABEL_VALUE.match(v)
    ]
    return problems
