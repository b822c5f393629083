"""The dashboard's logins on a secure group: a server-side table of sessions, each the user
whose AccessKey and SecretKey were checked against the group at login, under a random id that
only the browser's cookie holds (HttpOnly, SameSite=Strict). Actions are signed with the
session's credentials; reads keep the dashboard's own.

The table is bounded in size and in time: a session unused for SESSION_IDLE_S, or older than
SESSION_MAX_AGE_S, is gone; when MAX_SESSIONS are open, a new login pushes out the one unused
longest. Nothing is written to disk: a restart logs everyone out.
"""

from __future__ import annotations

import collections
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mqsecurity.credentials import Credentials

# Sessions open at once: people operating one cluster, with room for many browsers each.
MAX_SESSIONS = 256
# A session unused this long is logged out (an operator who walked away).
SESSION_IDLE_S = 30 * 60.0
# And any session this old, used or not: a stolen cookie does not last a working day.
SESSION_MAX_AGE_S = 12 * 3600.0
# Failed logins accepted per window, from anyone: beyond, a login is refused without asking the
# group until the window's oldest failure ages out (a password-guessing loop through the
# dashboard gets this many tries a minute).
MAX_FAILED_LOGINS = 10
FAILED_LOGIN_WINDOW_S = 60.0
# The cookie's name; its value is a session id of SESSION_ID_BYTES random bytes (urlsafe).
COOKIE_NAME = "mqdashboard_session"
SESSION_ID_BYTES = 32
# Longest id accepted from a cookie (the urlsafe text of SESSION_ID_BYTES is 43 characters).
MAX_SESSION_ID_CHARS = 64


@dataclass(slots=True)
class Session:
    credentials: Credentials
    created_s: float
    used_s: float

    @property
    def user(self) -> str:
        return self.credentials.access_key


class SessionTable:
    """Session id -> Session, thread-safe; ``clock`` is monotonic seconds (tests pass theirs)."""

    def __init__(
        self,
        max_sessions: int = MAX_SESSIONS,
        idle_s: float = SESSION_IDLE_S,
        max_age_s: float = SESSION_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert max_sessions > 0 and 0 < idle_s <= max_age_s
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._failures: collections.deque[float] = collections.deque(maxlen=MAX_FAILED_LOGINS)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def open(self, credentials: Credentials) -> str:
        """A new session for ``credentials`` (checked by the caller); its id."""
        now = self._clock()
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        with self._lock:
            self._expire(now)
            while len(self._sessions) >= self.max_sessions:
                oldest = min(self._sessions, key=lambda k: self._sessions[k].used_s)
                del self._sessions[oldest]
            self._sessions[session_id] = Session(credentials, now, now)
            assert len(self._sessions) <= self.max_sessions
        return session_id

    def get(self, session_id: str) -> Session | None:
        """The live session of ``session_id`` (its last use now), or None."""
        if not session_id or len(session_id) > MAX_SESSION_ID_CHARS:
            return None
        now = self._clock()
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if self._expired(session, now):
                del self._sessions[session_id]
                return None
            session.used_s = now
            return session

    def login_wait_s(self) -> float:
        """0 when a login may be tried now; else how long until one may (MAX_FAILED_LOGINS
        failed within FAILED_LOGIN_WINDOW_S)."""
        with self._lock:
            if len(self._failures) < MAX_FAILED_LOGINS:
                return 0.0
            return max(self._failures[0] + FAILED_LOGIN_WINDOW_S - self._clock(), 0.0)

    def login_failed(self) -> None:
        with self._lock:
            self._failures.append(self._clock())

    def close(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def _expired(self, session: Session, now: float) -> bool:
        return now - session.used_s > self.idle_s or now - session.created_s > self.max_age_s

    def _expire(self, now: float) -> None:
        for key in [k for k, s in self._sessions.items() if self._expired(s, now)]:
            del self._sessions[key]
