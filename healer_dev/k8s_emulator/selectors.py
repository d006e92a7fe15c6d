"""List selectors: ``fieldSelector`` and ``labelSelector`` (string and object forms)."""

from __future__ import annotations

import re
from typing import Any

from healer_dev.k8s_emulator.resources import Obj


def _dotted(obj: Obj, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def match_field_selector(obj: Obj, selector: str) -> bool:
    """``spec.nodeName=gpu-1,status.phase!=Succeeded`` (``=``, ``==``, ``!=`` on dotted paths)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            path, want = term.split("!=", 1)
            if str(_dotted(obj, path.strip()) or "") == want.strip():
                return False
        else:
            path, want = re.split(r"==?", term, maxsplit=1)
            if str(_dotted(obj, path.strip()) or "") != want.strip():
                return False
    return True


_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_label_selector(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def match_label_selector_string(labels: dict[str, str], selector: str) -> bool:
    """``labelSelector`` syntax: ``a=b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``."""
    for term in _split_label_selector(selector):
        m = _SET_TERM.match(term)
        if m:
            key, op, raw = m.groups()
            values = {v.strip() for v in raw.split(",")}
            if (op == "in") != (labels.get(key) in values):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in re.split(r"==?", term, maxsplit=1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def match_label_selector(labels: dict[str, str], selector: Obj | None) -> bool:
    """A ``metav1.LabelSelector`` (matchLabels, matchExpressions). ``None`` matches nothing, ``{}`` all."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
