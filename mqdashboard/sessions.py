"""The dashboard's logins on a secure group: a server-side table of sessions, each the user
whose AccessKey and SecretKey were checked against the group at login, under a random id that
only the browser's cookie holds (HttpOnly, SameSite=Strict). Actions are signed with the
session's credentials; reads keep the dashboard's own.

The table is bounded in size and in time: a session unused for SESSION_IDLE_S, or older than
SESSION_MAX_AGE_S, is gone; when MAX_SESSIONS are open, a new login pushes out the one unused
longest. Nothing is written to disk: a restart logs everyone out.

Failed logins are counted per source address (MAX_FAILED_LOGINS a window from one address), so
one machine guessing passwords locks out itself, not everyone; a ceiling over all addresses
(MAX_FAILED_LOGINS_TOTAL) still bounds the signature checks a guessing loop spread over many
addresses costs; the table of addresses is bounded (MAX_LOGIN_ADDRESSES, the least recent
forgotten first).
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
# Failed logins accepted per window from one source address: beyond, a login from that address
# is refused without asking the group until the window's oldest failure from it ages out (a
# password-guessing loop from one machine gets this many tries a minute), while logins from
# other addresses go on.
MAX_FAILED_LOGINS = 10
FAILED_LOGIN_WINDOW_S = 60.0
# Failed logins accepted per window from all addresses together: every login asks the group to
# check a signature, so this bounds the password checks a guessing loop spread over many
# addresses makes the group and the dashboard do (ten addresses at their own limit reach it;
# then every login waits, as it did before the limit was per address).
MAX_FAILED_LOGINS_TOTAL = 100
# Source addresses whose failures are remembered at once: each holds at most MAX_FAILED_LOGINS
# times, so the table stays under a few hundred KiB; when full, the address that failed least
# recently is forgotten (its limit starts again; the total above still holds).
MAX_LOGIN_ADDRESSES = 4096
# Longest source address kept (an IPv6 text is at most 45 characters; a proxy's is shorter).
MAX_ADDRESS_CHARS = 64
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
        # Source address -> its failures in time order, the address that failed least recently
        # first (the one MAX_LOGIN_ADDRESSES pushes out); and every address's, for the total.
        self._failures_by_address: collections.OrderedDict[str, collections.deque[float]] = (
            collections.OrderedDict()
        )
        self._failures: collections.deque[float] = collections.deque(maxlen=MAX_FAILED_LOGINS_TOTAL)
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

    def login_wait_s(self, address: str) -> float:
        """0 when a login from ``address`` may be tried now; else how long until one may
        (MAX_FAILED_LOGINS failed from it, or MAX_FAILED_LOGINS_TOTAL from all addresses,
        within FAILED_LOGIN_WINDOW_S)."""
        now = self._clock()
        with self._lock:
            wait_s = _window_wait_s(self._failures, MAX_FAILED_LOGINS_TOTAL, now)
            mine = self._failures_by_address.get(_address_key(address))
            if mine is not None:
                wait_s = max(wait_s, _window_wait_s(mine, MAX_FAILED_LOGINS, now))
            return wait_s

    def login_failed(self, address: str) -> None:
        """Count a failed login from ``address`` (the client's, as the server saw it)."""
        now = self._clock()
        key = _address_key(address)
        with self._lock:
            self._failures.append(now)
            mine = self._failures_by_address.pop(key, None)
            if mine is None:
                mine = collections.deque(maxlen=MAX_FAILED_LOGINS)
                while len(self._failures_by_address) >= MAX_LOGIN_ADDRESSES:
                    self._failures_by_address.popitem(last=False)
            mine.append(now)
            self._failures_by_address[key] = mine  # now the most recent
            assert len(self._failures_by_address) <= MAX_LOGIN_ADDRESSES

    @property
    def login_addresses(self) -> int:
        """Source addresses whose failed logins are remembered (tests, bounded)."""
        with self._lock:
            return len(self._failures_by_address)

    def close(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def _expired(self, session: Session, now: float) -> bool:
        return now - session.used_s > self.idle_s or now - session.created_s > self.max_age_s

    def _expire(self, now: float) -> None:
        for key in [k for k, s in self._sessions.items() if self._expired(s, now)]:
            del self._sessions[key]


def _address_key(address: str) -> str:
    """The table's key of a source address (bounded: the text is the peer's)."""
    return address[:MAX_ADDRESS_CHARS]


def _window_wait_s(failures: collections.deque[float], limit: int, now: float) -> float:
    """0 while fewer than ``limit`` of ``failures`` (times, oldest first, at most ``limit``
    kept) are within FAILED_LOGIN_WINDOW_S of ``now``; else how long until the oldest ages
    out."""
    if len(failures) < limit:
        return 0.0
    return max(failures[0] + FAILED_LOGIN_WINDOW_S - now, 0.0)
