"""Prometheus text exposition (format 0.0.4) pieces, printed the way the real exporters print them.

Two number styles exist, because the two exporters are written differently:

* dcgm-exporter formats each field with Go's ``fmt.Sprintf``: ``%d`` for integer fields
  (``1980``, ``61``) and ``%f`` for float fields (``650.194658``, ``0.972885``). Python's
  ``format(x, "d")`` and ``format(x, "f")`` print the same text, so dcgm templates use those specs.
* node_exporter goes through client_golang's ``expfmt``, which writes ``strconv.FormatFloat(v, 'g', -1,
  64)``: the shortest digits that round-trip, in exponent form when the decimal exponent is below -4 or
  at least 6 (``5e+10``, ``1.203344e+06``, ``4187``). :func:`go_float` reproduces that.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

#: The ``Content-Type`` both exporters answer a plain scrape with.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label_value(value: str) -> str:
    """A label value escaped for the text format (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """A ``# HELP`` text escaped for the text format (backslash and newline only)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def label_pairs(labels: Iterable[tuple[str, str]]) -> str:
    """``name="value"`` pairs joined by commas, in the given order, values escaped (no braces)."""
    return ",".join(f'{name}="{escape_label_value(value)}"' for name, value in labels)


def family_header(name: str, help_text: str, metric_type: str) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of one metric family, newline-terminated."""
    return f"# HELP {name} {escape_help(help_text)}\n# TYPE {name} {metric_type}\n"


def go_float(value: float) -> str:
    """``value`` as Go's ``strconv.FormatFloat(value, 'g', -1, 64)`` prints it (client_golang's style).

    Examples: ``0`` → ``0``, ``4187`` → ``4187``, ``1203344`` → ``1.203344e+06``, ``5e10`` → ``5e+10``,
    ``0.5`` → ``0.5``, ``NaN`` → ``NaN``, ``inf`` → ``+Inf``.
    """
    if value == 0:
        return "0"
    if isinstance(value, int) and -1_000_000 < value < 1_000_000:
        return str(value)
    f = float(value)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    # repr() gives the shortest digits that round-trip, like Go's shortest mode; only the layout differs.
    sign = "-" if f < 0 else ""
    text = repr(abs(f))
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text) if exp_text else 0
    whole, _, frac = mantissa.partition(".")
    if frac == "0":
        frac = ""
    digits = (whole + frac).lstrip("0")
    # decimal exponent of the first significant digit
    if whole.strip("0"):
        point = len(whole.lstrip("0")) + exponent
    else:
        point = exponent - (len(frac) - len(frac.lstrip("0")))
    digits = digits.rstrip("0") or "0"
    exp10 = point - 1
    if exp10 < -4 or exp10 >= 6:
        head, tail = digits[0], digits[1:]
        body = f"{head}.{tail}" if tail else head
        return f"{sign}{body}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"
