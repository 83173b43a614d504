"""Who may reach the dashboard and who may act through it: decisions over plain strings (pure).

Loopback binds answer only requests whose Host names a loopback address (a hostile web page that
rebinds its DNS name to 127.0.0.1 sends its own name as Host, and is refused), and, without a token,
only clients of the user running the dashboard (on Linux, by the owner of the client's socket). A non-loopback bind
needs a token; every request must then carry it. An action (a POST) must also come from the
dashboard's own page: its Origin must be the origin the request was sent to, or, for a script
without a browser, it sends no Origin but the token in an Authorization header.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})
MIN_TOKEN = 16  # a shorter secret is guessed over the network in reach of a weekend
TOKEN_COOKIE = "hermes_sup_token"


class BindError(ValueError):
    """A bind the dashboard refuses to serve on."""


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 possibly in brackets) is this machine only."""
    name = host.strip().lower().removeprefix("[").removesuffix("]")
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token_env: str | None, token: str | None) -> None:
    """Refuse a non-loopback bind without a token, and a token too short to be one."""
    if token_env is not None:
        if not token:
            raise BindError(f"--token-env {token_env}: the variable is not set or empty")
        if len(token) < MIN_TOKEN:
            raise BindError(f"--token-env {token_env}: the token is shorter than {MIN_TOKEN} characters")
        return
    if not is_loopback(host):
        raise BindError(f"--host {host} is not a loopback address: anyone who can reach it could steer the team; "
                        f"give --token-env VAR with a secret of at least {MIN_TOKEN} characters in VAR")


def split_host(value: str) -> tuple[str, str]:
    """A Host header as (host, port); port "" when none is given. What follows a bracketed IPv6
    address other than `:port` is kept as the port, for host_allowed to refuse."""
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else rest
    host, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return host, port


def _port_ok(host_header: str) -> bool:
    """No port, or digits: `localhost:evil.example` or `[::1]evil.example` only start with a loopback name."""
    value = host_header.strip()
    port = split_host(value)[1]
    if port:
        return port.isascii() and port.isdigit()
    return not value.endswith(":")


def host_allowed(host_header: str | None, bound_loopback: bool) -> bool:
    """On a loopback bind, only a loopback Host (no DNS rebinding); otherwise the token decides."""
    if not bound_loopback:
        return True
    if not host_header:
        return False
    return _port_ok(host_header) and is_loopback(split_host(host_header)[0])


def token_matches(expected: str | None, given: str | None) -> bool:
    """Whether `given` is the token (compared in constant time); always True without a token."""
    if expected is None:
        return True
    if not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def bearer(authorization: str | None) -> str | None:
    """The token in an `Authorization: Bearer ...` header, if any."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _hex_address(host: str, port: int) -> str | None:
    """An address as /proc/net/tcp{,6} spells it (the kernel's words in this machine's order)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    packed = address.packed
    words = b"".join(packed[i:i + 4][::-1] for i in range(0, len(packed), 4))  # little-endian hosts
    return f"{words.hex().upper()}:{port:04X}"


def peer_uid(tables: list[str], client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the client's end of a loopback TCP connection, from the text of
    /proc/net/tcp and /proc/net/tcp6 (pure); None when no line is that connection."""
    mine, theirs = _hex_address(*client), _hex_address(*server)
    if mine is None or theirs is None:
        return None
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 7 and fields[1] == mine and fields[2] == theirs:
                try:
                    return int(fields[7])
                except ValueError:
                    return None
    return None


def same_user(uid: int | None, own_uid: int) -> bool:
    """Whether a tokenless loopback dashboard answers a client of `uid`: only its own user (and root,
    who can read its files anyway). Another user of the machine reaches 127.0.0.1 as well, and an
    Origin header is no proof of a browser: it would steer the team, and read every transcript."""
    return uid is not None and uid in (own_uid, 0)


@dataclass(frozen=True)
class Verdict:
    status: int  # 0: allowed
    error: str = ""


ALLOWED = Verdict(0)


def same_origin(origin: str | None, host_header: str | None, scheme: str) -> bool:
    """Whether the Origin a browser sent is the origin this request was addressed to."""
    if not origin or not host_header or origin == "null":
        return False
    parts = urlsplit(origin)
    return parts.scheme == scheme and parts.netloc.lower() == host_header.strip().lower()


def judge(*, method: str, is_action: bool, host_header: str | None, origin: str | None, scheme: str,
          bound_loopback: bool, expected_token: str | None, header_token: str | None,
          cookie_token: str | None, query_token: str | None) -> Verdict:
    """Whether to serve one request, and if not, its status and reason."""
    if not host_allowed(host_header, bound_loopback):
        return Verdict(403, "this dashboard answers only to a loopback Host (127.0.0.1, localhost, ::1)")
    given = header_token or cookie_token or query_token
    if not token_matches(expected_token, given):
        return Verdict(401, "a token is needed: open the page as /?token=... or send Authorization: Bearer ...")
    if not is_action:
        return ALLOWED
    if method != "POST":
        return Verdict(405, "actions are POST requests")
    if origin is not None:
        if not same_origin(origin, host_header, scheme):
            return Verdict(403, "cross-origin action refused")
        return ALLOWED
    # No Origin: not a browser's fetch (every browser sends it on a POST). A script must then show
    # the token itself; a cookie alone would let any page's form submit an action.
    if expected_token is not None and header_token is None:
        return Verdict(403, "an action without an Origin header needs Authorization: Bearer TOKEN")
    if expected_token is None:
        return Verdict(403, "an action needs an Origin header naming this dashboard (as a browser sends)")
    return ALLOWED
