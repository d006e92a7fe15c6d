"""Leader election on a ``coordination.k8s.io/v1`` Lease: only the leader acts.

The algorithm is client-go's ``leaderelection.tryAcquireOrRenew`` (kubernetes/client-go
``tools/leaderelection``), with time passed in:

* no Lease → create it holding it (a 409 AlreadyExists means another replica was faster);
* held by someone else and the Lease record changed less than ``leaseDurationSeconds`` ago, as
  timed on this replica's own clock → not leader;
* ours → renew ``renewTime``; expired or released (empty holder) → take over (``acquireTime``,
  ``leaseTransitions + 1``);
* every update is a ``PUT`` carrying the ``resourceVersion`` read: a 409 Conflict means another
  replica wrote first, so this one is not leader.

Clocks need not agree. As client-go does (``observedRecord``/``observedTime``), a replica never
compares the times another process wrote in the Lease with its own clock: it notes, on its own
clock, when it last *saw the record change* (holder, renew and acquire times, transitions,
duration), and takes over only once the record has stayed the same for ``leaseDurationSeconds``
since then. A standby whose clock runs minutes ahead therefore waits as long as one whose clock
agrees. Pass ``now`` from a clock that does not jump (the controller passes
:func:`healer.clock.monotonic_clock`'s): only differences of it are used. What the algorithm
cannot absorb is clocks running at very different *rates*; the leader stops acting
:data:`RENEW_DEADLINE_FRACTION` of the duration after its last renewal (client-go's
``renewDeadline`` is 10 s of a 15 s lease), earlier than any standby may take over.

A failed renewal (an API error, a timeout) does not drop leadership at once: as client-go's
leader keeps retrying until its ``renewDeadline``, this one keeps leading while its last
successful renewal is younger than the lease duration (:meth:`LeaderElector.still_leader`, checked
before every write), and a standby cannot take over before then. A 409 (another replica wrote the
Lease) or a Lease held by someone else ends it at once.

Fencing: every acquisition by a new holder (an expired, released or empty Lease included)
increments ``leaseTransitions``, as client-go does; :attr:`LeaderElector.fencing_token` is that
number while this replica leads, so a newer leader always has a larger token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client as k8s

from healer.actions.apierrors import api_call
from healer.actions.drain import metadata_of
from healer.actions.timestamps import micro_time
from healer.clock import utc_now
from healer.config import KubernetesSettings
from healer.errors import KubernetesConflict, KubernetesError, KubernetesNotFound

log = logging.getLogger(__name__)

#: The leader acts at most this fraction of ``leaseDurationSeconds`` after its last successful
#: renewal (client-go's defaults: ``renewDeadline`` 10 s of a 15 s ``leaseDuration``); the margin
#: absorbs clocks that run at slightly different rates and the time a standby's read takes.
RENEW_DEADLINE_FRACTION = 2 / 3

#: What of a Lease's spec this replica compares to notice a change (client-go compares the whole
#: record): holder, acquire and renew times as written, transitions, duration.
_Record = tuple[str, datetime | None, datetime | None, int, int]


class LeaderElector:
    """One replica's view of the Lease ``settings.namespace/settings.lease_name``.

    Call :meth:`try_acquire_or_renew` every ``renew_interval_seconds``; act only while it returned
    True and :meth:`still_leader` holds; call :meth:`release` on shutdown so a successor need not
    wait for the lease to expire.

    Args:
        identity: unique per replica (the pod name), stored as ``holderIdentity``.
        clock: aware-UTC ``now`` for :meth:`release` when none is passed (the composition root's).
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        settings: KubernetesSettings,
        *,
        identity: str,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.clock = clock
        self.api = k8s.CoordinationV1Api(api_client)
        self.namespace = settings.namespace
        self.name = settings.lease_name
        self.duration_seconds = settings.lease_duration_seconds
        self.identity = identity
        self._timeout = settings.request_timeout_seconds
        self._leader = False
        self._renewed_at: datetime | None = None
        #: The Lease record as last read, and when (this replica's clock) it was first seen so.
        self._observed: _Record | None = None
        self._observed_at: datetime | None = None
        #: ``leaseTransitions`` of the Lease as this replica last acquired or renewed it (the
        #: fencing number stored with what it records); -1 before it first leads.
        self.fencing_token = -1
        #: Why this replica does not lead now ("held by X", "Lease API error: ..."); "" when it does.
        self.why_not = ""

    @property
    def is_leader(self) -> bool:
        """The last :meth:`try_acquire_or_renew` won the Lease."""
        return self._leader

    def still_leader(self, now: datetime) -> bool:
        """Leader, and ``now`` is within the renew deadline of the last successful renewal
        (:data:`RENEW_DEADLINE_FRACTION` of the lease duration, on this replica's clock): check
        before every write."""
        deadline = timedelta(seconds=self.duration_seconds * RENEW_DEADLINE_FRACTION)
        return self._leader and self._renewed_at is not None and now < self._renewed_at + deadline

    def _lose(self, why: str) -> bool:
        self.why_not = why
        if self._leader:
            log.warning("lease %s/%s: %s lost leadership: %s", self.namespace, self.name, self.identity, why)
        self._leader = False
        return False

    def _observe(self, record: _Record, now: datetime) -> None:
        """Note ``record`` as read at ``now``; the time moves only when the record changed."""
        if record != self._observed:
            self._observed, self._observed_at = record, now

    def _win(self, now: datetime, token: int) -> bool:
        if not self._leader:
            log.info(
                "lease %s/%s: %s is the leader (fencing %d)", self.namespace, self.name, self.identity, token
            )
        self.fencing_token = token
        self._leader = True
        self._renewed_at = now
        self.why_not = ""
        return True

    def try_acquire_or_renew(self, now: datetime) -> bool:
        """Acquire, renew or take over the Lease at ``now`` (aware UTC); True = this replica leads.

        An API failure (other than the 409 of losing a race) keeps a leader leading while
        :meth:`still_leader` holds (a transient failure, retried at the next renewal), and counts
        as not leading for a replica that was not, or once the renew deadline has passed.
        """
        try:
            return self._try(now)
        except KubernetesConflict:
            return self._lose("another replica updated the Lease first (409)")
        except KubernetesError as exc:
            if self.still_leader(now):
                log.warning(
                    "lease %s/%s: renewal failed, still leading until the deadline: %s",
                    self.namespace,
                    self.name,
                    exc,
                )
                return True
            return self._lose(f"Lease API error: {exc}")

    def _read(self) -> k8s.V1Lease:
        with api_call(f"read lease {self.namespace}/{self.name}"):
            return self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout)

    def _body(
        self,
        current: k8s.V1Lease | None,
        *,
        holder: str | None,
        duration: int,
        acquired: datetime,
        renewed: datetime,
        transitions: int,
    ) -> dict[str, Any]:
        """A Lease as a plain dict, guarded by ``current``'s resourceVersion when given.

        Not the client's model: it re-serialises MicroTime fields with ``isoformat()``, which drops
        the fraction at a whole second, and the API server refuses that (422).
        """
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            metadata["resourceVersion"] = metadata_of(current).resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration,
                "acquireTime": micro_time(acquired),
                "renewTime": micro_time(renewed),
                "leaseTransitions": transitions,
            },
        }

    def _replace(self, body: dict[str, Any], what: str) -> None:
        with api_call(f"{what} lease {self.namespace}/{self.name}"):
            # A dict body (the client validates it into V1Lease; see healer.actions.timestamps).
            self.api.replace_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=self._timeout  # type: ignore[arg-type]
            )

    def _try(self, now: datetime) -> bool:
        try:
            lease = self._read()
        except KubernetesNotFound:
            body = self._body(
                None,
                holder=self.identity,
                duration=self.duration_seconds,
                acquired=now,
                renewed=now,
                transitions=0,
            )
            def create() -> None:
                with api_call(f"create lease {self.namespace}/{self.name}"):
                    self.api.create_namespaced_lease(
                        self.namespace, body, _request_timeout=self._timeout  # type: ignore[arg-type]
                    )

            self._write_or_find(body, create)
            self._observe(_record_of(body), now)
            return self._win(now, 0)
        spec = lease.spec or k8s.V1LeaseSpec()
        holder = spec.holder_identity or ""
        duration = spec.lease_duration_seconds or self.duration_seconds
        self._observe(_record(spec, duration), now)
        if holder and holder != self.identity:
            assert self._observed_at is not None
            if now < self._observed_at + timedelta(seconds=duration):
                return self._lose(f"held by {holder}")
        transitions = spec.lease_transitions or 0
        if holder == self.identity:
            acquired = spec.acquire_time or now
        else:
            acquired, transitions = now, transitions + 1  # every takeover, as client-go counts them
        body = self._body(
            lease, holder=self.identity, duration=self.duration_seconds, acquired=acquired, renewed=now,
            transitions=transitions,
        )  # fmt: skip
        self._write_or_find(body, lambda: self._replace(body, "update"))
        self._observe(_record_of(body), now)
        return self._win(now, transitions)

    def _write_or_find(self, body: dict[str, Any], write: Callable[[], None]) -> None:
        """``write`` the Lease ``body``; a 409 whose Lease now reads exactly as ``body`` was this
        replica's own write, applied, whose answer was lost and which the HTTP client sent again:
        that is success, not another replica's write.

        Raises:
            KubernetesConflict: another replica wrote the Lease first.
        """
        try:
            write()
        except KubernetesConflict:
            spec = self._read().spec or k8s.V1LeaseSpec()
            if _record(spec, spec.lease_duration_seconds or 0) != _record_of(body):
                raise
            log.info("lease %s/%s: a repeated write found this replica's own", self.namespace, self.name)

    def release(self, now: datetime | None = None) -> None:
        """Give the Lease up (clear ``holderIdentity``) if this replica holds it; errors are logged,
        not raised (the Lease then simply expires)."""
        now = now or self.clock()
        was_leader, self._leader = self._leader, False
        if not was_leader:
            return
        try:
            lease = self._read()
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            # client-go's release: empty holder, 1 s duration, so the next candidate takes it at once.
            body = self._body(
                lease, holder=None, duration=1, acquired=now, renewed=now,
                transitions=lease.spec.lease_transitions or 0,
            )  # fmt: skip
            self._replace(body, "release")
            log.info("lease %s/%s: %s released leadership", self.namespace, self.name, self.identity)
        except KubernetesError as exc:
            log.warning("lease %s/%s: release failed (it will expire): %s", self.namespace, self.name, exc)


def _record(spec: k8s.V1LeaseSpec, duration: int) -> _Record:
    """The parts of a Lease read from the API server that tell one renewal from the next."""
    return (
        spec.holder_identity or "",
        spec.acquire_time,
        spec.renew_time,
        spec.lease_transitions or 0,
        duration,
    )


def _record_of(body: dict[str, Any]) -> _Record:
    """:func:`_record` of a Lease body this replica wrote."""
    spec = body["spec"]
    return (
        spec["holderIdentity"] or "",
        spec["acquireTime"],
        spec["renewTime"],
        spec["leaseTransitions"],
        spec["leaseDurationSeconds"],
    )
