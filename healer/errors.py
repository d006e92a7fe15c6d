"""Errors healer raises on purpose.

Every error a user can act on is a subclass of :class:`HealerError` and carries what they need
(file and line, node name, PromQL, HTTP status). Bugs are not wrapped: they surface with tracebacks.

::

    HealerError
    ├── ConfigError                 settings file or environment invalid
    ├── RuleError                   a rule file failed validation (carries every RuleProblem)
    ├── StoreError                  database unreachable or schema out of date
    ├── SourceError                 a metrics query failed
    │   ├── QueryError              Prometheus refused the PromQL (bad_data): the rule is broken
    │   └── SourceUnavailable       timeout, 5xx, transport error, non-JSON answer: retry later
    │       └── BinaryNotFound      a program healer starts (promtool, Prometheus) is not installed
    ├── KubernetesError             a Kubernetes API call failed (wraps ApiException as __cause__)
    │   ├── KubernetesNotFound      404
    │   ├── KubernetesConflict      409 (resourceVersion moved on, or someone else holds the Lease)
    │   └── KubernetesTooManyRequests  429 (an eviction blocked by a PodDisruptionBudget)
    ├── TicketError                 a ticket could not be rendered or delivered
    │   └── SignatureError          an inbound callback's signature is missing, wrong, stale or replayed
    ├── NotLeader                   this replica no longer leads: the step in hand is abandoned
    └── StaleState                  a node's recorded state moved on since the step was decided
"""

from __future__ import annotations


class HealerError(Exception):
    """Base of every error healer raises on purpose."""


class ConfigError(HealerError):
    """The settings (environment or `--config` file) are invalid."""


class RuleError(HealerError):
    """A rule file (or set of files) failed validation.

    ``problems`` holds every problem found, not just the first, each with file, line and field.
    """

    def __init__(self, problems: list[object]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class StoreError(HealerError):
    """The database cannot be reached or its schema is not at the expected revision."""


class SourceError(HealerError):
    """A query to the metrics source failed (not an empty result: a failure)."""


class QueryError(SourceError):
    """Prometheus refused the expression (``errorType: bad_data``): the rule itself is broken."""


class SourceUnavailable(SourceError):
    """The source could not answer now (timeout, 5xx, transport error, non-JSON body)."""


class BinaryNotFound(SourceUnavailable):
    """A program healer (or its development tooling) starts is not installed: ``name``, and the
    Debian/Ubuntu ``package`` that installs it."""

    def __init__(self, name: str, *, package: str, where: str = "PATH") -> None:
        self.name = name
        self.package = package
        super().__init__(f"{name} not found on {where} (Debian/Ubuntu package '{package}')")


class KubernetesError(HealerError):
    """A Kubernetes API call failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class KubernetesNotFound(KubernetesError):
    """The object does not exist (HTTP 404)."""


class KubernetesConflict(KubernetesError):
    """The object changed under us or the Lease is held by someone else (HTTP 409)."""


class KubernetesTooManyRequests(KubernetesError):
    """HTTP 429: for an eviction, a PodDisruptionBudget does not allow it now."""


class TicketError(HealerError):
    """A ticket payload could not be rendered or delivered."""


class SignatureError(TicketError):
    """An inbound provider callback failed HMAC verification (missing, wrong, stale or replayed)."""


class NotLeader(HealerError):
    """This replica no longer leads (its Lease expired, or a newer leader's fencing number is in the
    database): the step in hand is abandoned, unwritten."""


class StaleState(HealerError):
    """A node's recorded state is no longer the one a step was decided from (another writer moved
    it): the step is not recorded."""
