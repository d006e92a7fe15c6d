"""Repair requests to the node agent (``healer agent``) and the agent's answers. Pure.

The controller publishes a signed request as the annotation ``<domain>/repair-request`` on the
Node it names (healer already patches nodes, so this needs no new RBAC verb); the agent on that
node (a DaemonSet) reads only its own Node, verifies the request and answers in
``<domain>/repair-result``. Both are one-line JSON.

Request fields: ``node``, ``action`` (``reset-gpu`` | ``reboot`` | ``capture``: only capture the
log bundle, for the ticket, changing nothing on the node), ``gpu`` (index, or None for a reboot or
a capture), ``incident``, ``nonce`` (unique per request), ``expires`` (RFC 3339 UTC) and
``signature``: HMAC-SHA256, hex, with the shared secret (a Secret mounted into both) over the
canonical JSON of the other fields (keys sorted, no blanks), as the provider webhooks sign
(``healer.tickets.signing``).

The agent refuses (answers ``refused`` with a reason, and logs it) a request that is not valid
JSON, is unsigned or wrongly signed, names another node, has expired, reuses a nonce it already
answered, or asks for an action it does not know.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import hmac
import json
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal

RepairAction = Literal["reset-gpu", "reboot", "capture"]
REPAIR_ACTIONS: tuple[RepairAction, ...] = ("reset-gpu", "reboot", "capture")
#: The action that only captures the log bundle (at quarantine, for the ticket): nothing is run.
CAPTURE = "capture"
ResultStatus = Literal["succeeded", "failed", "refused"]


def request_key(domain: str) -> str:
    """The Node annotation holding the controller's request."""
    return f"{domain}/repair-request"


def result_key(domain: str) -> str:
    """The Node annotation holding the agent's answer."""
    return f"{domain}/repair-result"


@dataclass(frozen=True)
class RepairRequest:
    """One request to the agent on ``node`` (see the module docstring for the fields)."""

    node: str
    action: str
    gpu: str | None
    incident: int
    nonce: str
    expires: str  # RFC 3339, UTC

    def payload(self) -> bytes:
        """The signed bytes: canonical JSON of the fields."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    def signed(self, secret: bytes) -> str:
        """The annotation value: the fields plus ``signature``."""
        signature = hmac.new(secret, self.payload(), hashlib.sha256).hexdigest()
        return json.dumps({**asdict(self), "signature": signature}, sort_keys=True, separators=(",", ":"))


class Refused(ValueError):
    """A request the agent will not carry out; ``nonce`` when the request named one."""

    def __init__(self, reason: str, nonce: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.nonce = nonce


def verify(
    raw: str, *, secret: bytes, node: str, now: datetime, seen_nonces: frozenset[str] = frozenset()
) -> RepairRequest:
    """The request in ``raw`` if the agent of ``node`` may carry it out at ``now``.

    Raises :class:`Refused` with the reason otherwise (signature checked before anything else is
    trusted; compared in constant time).
    """
    try:
        data: Any = json.loads(raw)
    except ValueError as exc:
        raise Refused(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Refused("not a JSON object")
    nonce = data.get("nonce") if isinstance(data.get("nonce"), str) else None
    signature = data.pop("signature", None)
    if not isinstance(signature, str) or not signature:
        raise Refused("unsigned request", nonce)
    try:
        request = RepairRequest(
            node=str(data["node"]),
            action=str(data["action"]),
            gpu=None if data.get("gpu") is None else str(data["gpu"]),
            incident=int(data["incident"]),
            nonce=str(data["nonce"]),
            expires=str(data["expires"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise Refused(f"malformed request: {exc!r}", nonce) from None
    if set(data) != {"node", "action", "gpu", "incident", "nonce", "expires"}:
        raise Refused("unexpected fields in the request", nonce)
    wanted = hmac.new(secret, request.payload(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(wanted, signature):
        raise Refused("bad signature: not signed by the controller", nonce)
    if request.node != node:
        raise Refused(f"addressed to node {request.node!r}, this is {node!r}", nonce)
    try:
        expires = datetime.fromisoformat(request.expires)
    except ValueError:
        raise Refused(f"bad expiry {request.expires!r}", nonce) from None
    if expires.tzinfo is None or expires <= now:
        raise Refused(f"expired at {request.expires}", nonce)
    if request.nonce in seen_nonces:
        raise Refused(f"nonce {request.nonce} already answered (replay)", nonce)
    if request.action not in REPAIR_ACTIONS:
        raise Refused(f"unknown action {request.action!r}", nonce)
    if request.action == "reset-gpu" and (request.gpu is None or not request.gpu.isdigit()):
        raise Refused(f"reset-gpu needs a GPU index, got {request.gpu!r}", nonce)
    return request


@dataclass(frozen=True)
class RepairResult:
    """The agent's answer to the request with ``nonce``: ``succeeded``, ``failed`` or ``refused``."""

    nonce: str
    status: str
    reason: str = ""
    at: str = ""
    output: str = ""
    #: The log bundle captured before a reboot or a GPU reset, or for a capture (gzip + base64;
    #: healer.nodeagent.bundle), or "".
    bundle: str = ""

    def encode(self) -> str:
        fields = asdict(self)
        if not self.bundle:
            del fields["bundle"]  # the answer reads as before where there is none
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, raw: str | None) -> RepairResult | None:
        """The answer in ``raw`` (None when absent or malformed)."""
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return cls(
                nonce=str(data["nonce"]),
                status=str(data["status"]),
                reason=str(data.get("reason", ""))[:2000],
                at=str(data.get("at", "")),
                output=str(data.get("output", ""))[:4000],
                bundle=_bundle(data.get("bundle")),
            )
        except (ValueError, KeyError, TypeError):
            return None


#: The largest bundle read from an answer (base64 characters): the agent writes at most 64 KiB.
BUNDLE_MAX_CHARS = 96 * 1024


def _bundle(value: object) -> str:
    """A bundle as written, or "" when absent, not text or over :data:`BUNDLE_MAX_CHARS` (a cut
    bundle would not decode)."""
    return value if isinstance(value, str) and len(value) <= BUNDLE_MAX_CHARS else ""


def decode_bundle(data: str) -> str:
    """The text of a log bundle as the agent writes it (gzip, then base64). Raises ValueError when
    ``data`` is not one."""
    try:
        return gzip.decompress(base64.b64decode(data, validate=True)).decode("utf-8", "replace")
    except (binascii.Error, OSError, EOFError) as exc:
        raise ValueError(f"not a log bundle: {exc}") from None
