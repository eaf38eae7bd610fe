"""Dashboard sessions: signing in with an API key opens one; its cookie carries a random token.

The control database keeps the token's sha256 (never the token), the key it acts for, a CSRF token that
every state-changing form must echo, and an expiry. A session is only as good as its key: a revoked or
expired key ends every session it opened at the next request. A key holds at most `max_sessions` live
sessions (VIPS_MAX_SESSIONS_PER_KEY): signing in once more closes its oldest, so repeated sign-ins never
grow the table without bound.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, delete, insert, select

from control.store.keys import ROLES, Principal, expired
from control.store.models import api_keys, ui_sessions
from control.store.timestamps import aware
from privacy_wall.sqlengine import reading

COOKIE = "vips_session"


@dataclass(frozen=True)
class UiSession:
    """Who is signed in, and the CSRF token their forms carry."""

    principal: Principal
    csrf_token: str


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def open_session(
    engine: Engine, principal: Principal, lifetime: timedelta, *, max_sessions: int = 10
) -> tuple[str, UiSession]:
    """A new session for the principal: (the cookie's token, the session). Expired sessions go too, and
    the key's oldest sessions beyond the newest `max_sessions` (this one included)."""
    if max_sessions < 1:
        raise ValueError("max_sessions must be at least 1")
    token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(delete(ui_sessions).where(ui_sessions.c.expires_at < now))
        conn.execute(
            insert(ui_sessions).values(
                token_hash=_hash(token),
                key_id=principal.key_id,
                csrf_token=csrf,
                created_at=now,
                expires_at=now + lifetime,
            )
        )
        # the key's other sessions, newest first: all but the newest max_sessions - 1 of them close
        stale = (
            conn.execute(
                select(ui_sessions.c.token_hash)
                .where(ui_sessions.c.key_id == principal.key_id, ui_sessions.c.token_hash != _hash(token))
                .order_by(ui_sessions.c.created_at.desc(), ui_sessions.c.expires_at.desc())
                .offset(max_sessions - 1)
            )
            .scalars()
            .all()
        )
        if stale:
            conn.execute(delete(ui_sessions).where(ui_sessions.c.token_hash.in_(stale)))
    return token, UiSession(principal, csrf)


def find_session(engine: Engine, token: str | None) -> UiSession | None:
    """The session of a cookie token, or None if there is none, it expired, or its key no longer works."""
    if not token or len(token) > 128:
        return None
    with reading(engine) as conn:
        row = conn.execute(
            select(
                ui_sessions.c.csrf_token,
                ui_sessions.c.expires_at,
                api_keys.c.id,
                api_keys.c.role,
                api_keys.c.dataset,
                api_keys.c.revoked,
                api_keys.c.expires_at.label("key_expires_at"),
            )
            .join(api_keys, api_keys.c.id == ui_sessions.c.key_id)
            .where(ui_sessions.c.token_hash == _hash(token))
        ).one_or_none()
    if row is None or aware(row.expires_at) <= datetime.now(UTC):
        return None
    if row.revoked or row.role not in ROLES or expired(row.key_expires_at):
        return None
    return UiSession(Principal(key_id=row.id, role=row.role, dataset=row.dataset), row.csrf_token)


def close_session(engine: Engine, token: str | None) -> None:
    """Sign out: the token opens nothing from now on."""
    if token:
        with engine.begin() as conn:
            conn.execute(delete(ui_sessions).where(ui_sessions.c.token_hash == _hash(token)))
