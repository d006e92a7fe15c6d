"""Who is asking, and may they change things: identities, roles, login sessions and CSRF.

Identity, first match wins:

1. ``Authorization: Bearer <token>``: a token from ``api.tokens`` (an unknown token is a 401, not
   a fall-through to weaker identities).
2. The login cookie (``healer_session``) set by the login form after the user gave a valid token. It
   holds a digest of the token, never the token, and a random session id; it is re-checked against
   the settings on every request, so removing a token from the settings logs its sessions out, and
   against the revoked sessions (:mod:`api.sessions`), so a logout ends every copy of the cookie.
3. The authenticating proxy's user header (``api.proxy_user_header``, e.g. oauth2-proxy's
   ``X-Forwarded-User``); operator when one of the groups in ``api.proxy_groups_header`` is in
   ``api.operator_groups``. Only configure this when healer is reachable through the proxy alone.
4. ``api.anonymous_role`` (``none`` refuses the request with 401).

CSRF: every non-API response carries a ``healer_csrf`` cookie (a signed random id); forms embed
``HMAC(secret, id + login session id)`` and every form POST must send it back: a cookie and token
pair planted from another session does not match. Both cookies are HttpOnly and
``SameSite=Strict``. JSON API POSTs authenticated with a bearer header are exempt: a browser cannot
attach that header to a cross-site request. JSON POSTs authenticated any other way (login cookie,
proxy header, anonymous) must send the token in the ``X-CSRF-Token`` header, which a cross-site
form cannot set.

The signing key is ``api.csrf_secret``, or a random one per process (sessions then end on restart
and differ between replicas: set the secret when running more than one).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Request
from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ApiError
from api.sessions import RevokedSessions
from healer.config import ApiSettings

Role = Literal["viewer", "operator"]

SESSION_COOKIE = "healer_session"
CSRF_COOKIE = "healer_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
#: A login lasts a working shift; the CSRF id a bit longer so an open form survives.
SESSION_MAX_AGE_SECONDS = 12 * 3600
CSRF_MAX_AGE_SECONDS = 24 * 3600

#: Paths that never need a CSRF cookie (machines, not browsers, call them).
_NO_CSRF_COOKIE_PREFIXES = ("/api/", "/metrics", "/healthz", "/readyz", "/static/", "/openapi.json")


@dataclass(frozen=True)
class Identity:
    """The caller: ``user`` (shown in the audit log), ``role``, and how it was established."""

    user: str
    role: Role
    via: Literal["token", "session", "proxy", "anonymous"]

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Auth:
    """Identity resolution, login cookies and CSRF tokens for one app (built from :class:`ApiSettings`)."""

    def __init__(self, settings: ApiSettings, *, revoked: RevokedSessions | None = None) -> None:
        self.settings = settings
        self.revoked = revoked
        self._secret = (settings.csrf_secret or secrets.token_urlsafe(32)).encode()
        self._sessions = URLSafeTimedSerializer(self._secret, salt="healer-session")
        self._csrf_ids = URLSafeTimedSerializer(self._secret, salt="healer-csrf-id")
        # Keyed by digest: the lookup never compares the secret token itself byte by byte.
        self._tokens = {_digest(t.token): t for t in settings.tokens}

    # --- identity ---------------------------------------------------------------------------

    def identify(self, request: Request) -> Identity | None:
        """The caller's identity, or ``None`` when anonymous access is off and nothing identifies them.

        Raises:
            ApiError: 401 for a bearer token that is not in the settings.
        """
        header = request.headers.get("authorization", "")
        if header:
            scheme, _, value = header.partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                raise ApiError(401, "Authorization must be 'Bearer <token>'")
            token = self._tokens.get(_digest(value.strip()))
            if token is None:
                raise ApiError(401, "unknown bearer token")
            return Identity(user=token.user, role=token.role, via="token")
        login = self.read_login(request.cookies.get(SESSION_COOKIE))
        if login is not None:
            return login
        proxy_user = self._proxy_user(request)
        if proxy_user is not None:
            return proxy_user
        if self.settings.anonymous_role == "none":
            return None
        return Identity(user="anonymous", role=self.settings.anonymous_role, via="anonymous")

    def _proxy_user(self, request: Request) -> Identity | None:
        if not self.settings.proxy_user_header:
            return None
        user = request.headers.get(self.settings.proxy_user_header, "").strip()
        if not user:
            return None
        groups: set[str] = set()
        if self.settings.proxy_groups_header:
            raw = request.headers.get(self.settings.proxy_groups_header, "")
            groups = {g.strip() for g in raw.split(",") if g.strip()}
        role: Role = "operator" if groups & set(self.settings.operator_groups) else "viewer"
        return Identity(user=user, role=role, via="proxy")

    # --- login sessions ---------------------------------------------------------------------

    def login(self, token: str) -> tuple[Identity, str] | None:
        """Check a token typed into the login form; the identity and the signed cookie value, or None."""
        digest = _digest(token.strip())
        found = self._tokens.get(digest)
        if found is None:
            return None
        cookie = self._sessions.dumps({"tok": digest, "sid": secrets.token_urlsafe(16)})
        return Identity(user=found.user, role=found.role, via="session"), cookie

    def session_id(self, cookie: str | None) -> str | None:
        """The session id in a login cookie whose signature and age are valid (revoked or not)."""
        if not cookie:
            return None
        try:
            data: Any = self._sessions.loads(cookie, max_age=SESSION_MAX_AGE_SECONDS)
        except BadSignature:
            return None
        sid = data.get("sid") if isinstance(data, dict) else None
        return sid if isinstance(sid, str) and sid else None

    def read_login(self, cookie: str | None) -> Identity | None:
        """The identity of a login cookie, if its signature, age and token are still valid and its
        session was not logged out."""
        sid = self.session_id(cookie)
        if sid is None:
            return None
        data: Any = self._sessions.loads(cookie or "", max_age=SESSION_MAX_AGE_SECONDS)
        token = self._tokens.get(data.get("tok", ""))
        if token is None or (self.revoked is not None and self.revoked.is_revoked(sid)):
            return None
        return Identity(user=token.user, role=token.role, via="session")

    def logout(self, cookie: str | None, *, user: str) -> None:
        """End the session of ``cookie`` on the server side (a copy of the cookie stops working)."""
        sid = self.session_id(cookie)
        if sid is not None and self.revoked is not None:
            self.revoked.revoke(sid, by=user)

    # --- CSRF -------------------------------------------------------------------------------

    def new_csrf_cookie(self) -> tuple[str, str]:
        """A fresh random CSRF id and its signed cookie value."""
        csrf_id = secrets.token_urlsafe(16)
        return csrf_id, self._csrf_ids.dumps(csrf_id)

    def read_csrf_cookie(self, cookie: str | None) -> str | None:
        """The CSRF id in a signed cookie value, or None when missing, forged or expired."""
        if not cookie:
            return None
        try:
            value: Any = self._csrf_ids.loads(cookie, max_age=CSRF_MAX_AGE_SECONDS)
        except BadSignature:
            return None
        return value if isinstance(value, str) else None

    def csrf_token(self, csrf_id: str, session_id: str | None = None) -> str:
        """The token forms carry for the browser holding ``csrf_id``, bound to its login session
        (``session_id``; none before login): a token planted from another session is refused."""
        message = f"csrf:{csrf_id}:{session_id or ''}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def check_csrf(self, request: Request, submitted: str | None) -> None:
        """Refuse (403, code ``csrf``) unless ``submitted`` matches the caller's CSRF cookie and
        login session."""
        state = request.scope.get("state", {})
        csrf_id = state.get("csrf_id")
        if not csrf_id or not request.cookies.get(CSRF_COOKIE):
            raise ApiError(403, "missing CSRF cookie: reload the page and try again", code="csrf")
        expected = self.csrf_token(csrf_id, state.get("session_id"))
        if not submitted or not hmac.compare_digest(submitted, expected):
            raise ApiError(403, "invalid CSRF token: reload the page and try again", code="csrf")


def cookie_header(name: str, value: str, *, max_age: int, secure: bool) -> str:
    """A ``Set-Cookie`` value: HttpOnly, SameSite=Strict, whole site."""
    parts = [f"{name}={value}", "Path=/", f"Max-Age={max_age}", "HttpOnly", "SameSite=Strict"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


class CsrfCookieMiddleware:
    """Gives every browser a signed CSRF id (``request.state.csrf_id``), setting the cookie when absent.

    A pure ASGI middleware (no response buffering). Responses may also ask for cookies to be set via
    ``request.state.set_cookies`` (a list of ``Set-Cookie`` values), which the login and logout
    handlers use.
    """

    def __init__(self, app: ASGIApp, auth: Auth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        request = Request(scope)
        csrf_id = self.auth.read_csrf_cookie(request.cookies.get(CSRF_COOKIE))
        secure = scope.get("scheme") == "https"
        new_cookies: list[str] = []
        if csrf_id is None and not scope["path"].startswith(_NO_CSRF_COOKIE_PREFIXES):
            csrf_id, value = self.auth.new_csrf_cookie()
            new_cookies.append(cookie_header(CSRF_COOKIE, value, max_age=CSRF_MAX_AGE_SECONDS, secure=secure))
        state["csrf_id"] = csrf_id
        state["session_id"] = self.auth.session_id(request.cookies.get(SESSION_COOKIE))
        state["set_cookies"] = []

        async def send_with_cookies(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = new_cookies + list(state.get("set_cookies", []))
                if extra:
                    headers = MutableHeaders(scope=message)
                    for value in extra:
                        headers.append("set-cookie", value)
            await send(message)

        await self.app(scope, receive, send_with_cookies)
