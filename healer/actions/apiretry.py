"""A Kubernetes API request that failed transiently is retried on its own, inside the step that sent it.

A step is a sequence of requests (read the node, patch it, patch its status, post an Event, list
its pods ...). Failing the whole step for one failed request costs the node a pass or more and can
leave it half done (cordoned, still recorded ``suspect``); retrying that request costs a fraction
of a second. :class:`RetryingApiClient` wraps the node adapter's ``ApiClient``, so every request of
:mod:`healer.actions.kubernetes`, of its drain (:mod:`healer.actions.drain`) and of the drain's
checkpoint requests is retried by this policy (with ``tenacity``):

Retried (:func:`transient_answer`, :func:`transient_error`):
    5xx answers; 429 (API priority and fairness, max-in-flight), unless its Status names the cause
    ``DisruptionBudget`` (a budget refusing an eviction is not rate limiting); transport failures
    (connection refused, reset or dropped, a read past the request timeout).
Not retried:
    other 4xx: 404 (gone) and 409 (conflict: :meth:`KubernetesNodeActions.edit` re-reads the node
    and re-applies its patch) are the caller's to act on; 400, 401, 403, 422 ... do not change by
    asking again. Watches (a stream: the drain falls back to its next step) and evictions go
    through untouched (:func:`policy_for`): :mod:`healer.actions.drain` reads an eviction's answer
    itself (429 ``DisruptionBudget`` holds the pod, another 429 waits its ``Retry-After`` once, 500
    "more than one PodDisruptionBudget" blocks), and a pod an eviction missed is evicted by the
    next drain round, which lists the pods on the node again. An eviction re-sent by name after a
    lost answer can meet the controller's replacement pod of the same name, Pending: the API server
    retries its uid precondition for about 10 s before answering 409 (seen on the test control
    plane), holding the whole drain pass.

How often and how long (:data:`READ`, :data:`WRITE`):
    reads (GET): :data:`READ_ATTEMPTS` tries, full jitter, the n-th wait uniform in
    ``[0, min(0.4, 0.05 * 2**(n-1))]`` s: well under a second in all;
    writes (POST, PUT, PATCH, DELETE): :data:`WRITE_ATTEMPTS` tries, waits 0.2, 0.4, 0.8 s each
    plus up to 0.1 s of jitter: under 2 s in all;
    a 429 or 503 with ``Retry-After``: that many seconds, at most :data:`RETRY_AFTER_MAX`, instead;
    no new try starts once :data:`WINDOW_SECONDS` have passed since the first (a request that timed
    out at the default 10 s gets one more try, not three).
The last answer, or the last transport error, is the caller's, mapped by
:mod:`healer.actions.apierrors` as before.

Retried writes are safe as healer sends them: a node patch carries the node's ``resourceVersion``
(a retry after a try that was applied but whose answer was lost gets 409, and ``edit`` re-reads
the node, finds it done and sends nothing more); status and annotation patches set values; an Event
has a name of its own (a 409 on a retry means the first try created it); a pod DELETE carries the
pod's uid (404 or 409: gone).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import tenacity
import urllib3
from kubernetes import client as k8s
from kubernetes.client.rest import RESTResponse

from healer.actions.drain import is_budget_block

log = logging.getLogger(__name__)

#: Tries of one read (GET), the first included.
READ_ATTEMPTS = 4
#: Tries of one write (POST, PUT, PATCH, DELETE), the first included.
WRITE_ATTEMPTS = 4
#: Longest wait (seconds) a ``Retry-After`` may ask for; a longer one is cut to this.
RETRY_AFTER_MAX = 5.0
#: No new try of a request starts this many seconds after its first began.
WINDOW_SECONDS = 15.0


@dataclass(frozen=True)
class Policy:
    """How one kind of request is retried: its tries (the first included) and the wait before
    each next one (seconds, from tenacity's call state) when no ``Retry-After`` says otherwise."""

    kind: str
    attempts: int
    wait: Callable[[tenacity.RetryCallState], float]


#: Reads: quick tries with full jitter (a failed GET changed nothing; many nodes' reads retrying at
#: once must not come back together).
READ = Policy("read", READ_ATTEMPTS, tenacity.wait_random_exponential(multiplier=0.05, max=0.4))
#: Writes: a short exponential backoff, jittered.
WRITE = Policy(
    "write", WRITE_ATTEMPTS, tenacity.wait_exponential(multiplier=0.2, max=2.0) + tenacity.wait_random(0, 0.1)
)


def policy_for(method: str, url: str) -> Policy | None:
    """The policy of a request, or None when it is not retried here (a watch; an eviction)."""
    parts = urlsplit(url)
    method = method.upper()
    if method == "GET":
        watch = parse_qs(parts.query).get("watch", [""])[-1].lower()
        return None if watch in ("true", "1") else READ
    if method == "POST" and parts.path.endswith("/eviction"):
        return None
    return WRITE


def transient_answer(status: int, body: bytes | str | None) -> bool:
    """Whether an answer with ``status`` (and ``body``, the Status JSON) may succeed if sent again:
    5xx, and 429 other than a PodDisruptionBudget's refusal. 2xx and other 4xx: no."""
    if status == 429:
        return not is_budget_block(body)
    return 500 <= status <= 599


def transient_error(exc: BaseException) -> bool:
    """Whether a request that raised ``exc`` may succeed if sent again: transport failures
    (urllib3's errors, a socket's ``OSError``: refused, reset, dropped, timed out)."""
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """An answer's ``Retry-After`` in seconds, cut to :data:`RETRY_AFTER_MAX` (None when absent or
    not a number of seconds)."""
    value = (headers or {}).get("Retry-After")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return None if seconds is None else min(RETRY_AFTER_MAX, max(0.0, seconds))


def _transient_response(response: Any) -> bool:
    if not isinstance(response, RESTResponse) or 200 <= response.status <= 299:
        return False
    # Read now: the connection goes back to the pool, and the caller reads the same bytes (cached).
    return transient_answer(response.status, response.read())


def _wait(policy: Policy) -> Callable[[tenacity.RetryCallState], float]:
    def wait(state: tenacity.RetryCallState) -> float:
        outcome = state.outcome
        if outcome is not None and not outcome.failed:
            response = outcome.result()
            if response.status in (429, 503):
                asked = retry_after(response.headers)
                if asked is not None:
                    return asked
        return policy.wait(state)

    return wait


def _last(state: tenacity.RetryCallState) -> Any:
    """The last try's answer (or its error, raised), when no try is left."""
    assert state.outcome is not None
    return state.outcome.result()


def _log_retry(policy: Policy, what: str) -> Callable[[tenacity.RetryCallState], None]:
    def before_sleep(state: tenacity.RetryCallState) -> None:
        assert state.outcome is not None
        if state.outcome.failed:
            exc = state.outcome.exception()
            why = f"{type(exc).__name__}: {exc}"
        else:
            why = f"HTTP {state.outcome.result().status}"
        wait = state.next_action.sleep if state.next_action else 0.0
        log.info(
            "%s: %s; try %d of %d in %.2f s",
            what,
            why[:200],
            state.attempt_number + 1,
            policy.attempts,
            wait,
        )

    return before_sleep


class RetryingApiClient(k8s.ApiClient):
    """An ``ApiClient`` that sends each request through ``inner`` and retries it by
    :func:`policy_for` (see the module docstring); everything else is ``inner``'s.

    Args:
        inner: the client configured from the kubeconfig or service account; its configuration,
            connection pool and default headers are shared, not copied, and it is not closed here.
        sleep: how a wait between tries is spent (tests pass a recorder).
    """

    def __init__(self, inner: k8s.ApiClient, *, sleep: Callable[[float], None] = time.sleep) -> None:
        # Not ApiClient.__init__: it would open a second connection pool. The generated API
        # methods call self.call_api, so the state is shared and only call_api differs; inner's
        # own call_api (bound, or one a caller set on the instance to count requests) sends.
        vars(self).update(vars(inner))
        vars(self).pop("call_api", None)
        # Wrapping a retrying client again must not multiply the tries.
        self._send: Callable[..., RESTResponse] = (
            inner._send if isinstance(inner, RetryingApiClient) else inner.call_api
        )
        self._sleep = sleep

    def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> RESTResponse:
        """Send the request; retry it while its answer or error is transient and tries are left.

        Returns the last answer (a non-2xx one too: the caller raises it as ``ApiException``);
        raises the last transport error.
        """

        def send() -> RESTResponse:
            answer: RESTResponse = self._send(method, url, header_params, body, post_params, _request_timeout)
            return answer

        policy = policy_for(method, url)
        if policy is None:
            return send()
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(policy.attempts) | tenacity.stop_after_delay(WINDOW_SECONDS),
            wait=_wait(policy),
            retry=(
                tenacity.retry_if_exception(transient_error) | tenacity.retry_if_result(_transient_response)
            ),
            retry_error_callback=_last,
            before_sleep=_log_retry(policy, f"{method} {urlsplit(url).path}"),
            sleep=self._sleep,
        )
        last: RESTResponse = retrying(send)
        return last
