"""The `[federation]` section of relay.toml: which Redis server links this relay to the other
nodes of its team, the team (the key prefix) and this node's name.

    [federation]
    url = "redis://relay:secret@redis.example:6379/0"     # or rediss:// (TLS)
    team = "acme"
    node = "laptop"                                         # default: <host>-<6 hex of the project root>

Also from the environment (`RELAY_FEDERATION_URL`, `_TEAM`, `_NODE`, `_HEARTBEAT`), so a
password need not be written in a file agents can read. Nothing here imports `redis`: without
the section relay is the single-machine relay and never loads it.
"""
import dataclasses
import hashlib
import re
import socket
import urllib.parse

NAME_RULE = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
NAME = re.compile(NAME_RULE + r"\Z")
KEYS = ("url", "team", "node", "heartbeat", "ack_timeout", "max_agents_per_node")
SCHEMES = ("redis", "rediss", "redis+sentinel", "redis+cluster", "rediss+cluster")
# Characters a password must hold percent-encoded in a URL: unencoded, they end the user part.
RESERVED = {"#": "%23", "/": "%2F", "?": "%3F"}


@dataclasses.dataclass(frozen=True)
class Federation:
    url: str | None                 # None where it is not given (an agent's shell): the daemon needs it
    team: str
    node: str
    heartbeat: float = 5.0          # seconds between two directory announcements
    ack_timeout: float = 30.0       # a message not acknowledged by its node for this long is published again
    max_agents_per_node: int = 4096     # names one node's directory entry may hold

    @property
    def shown_url(self):
        """The URL with its password hidden (for status and logs)."""
        return redact(self.url) if self.url is not None else "(not given here)"

    @property
    def sentinel(self):
        return self.url is not None and self.url.startswith("redis+sentinel://")

    @property
    def cluster(self):
        return self.url is not None and self.url.split("://", 1)[0] in ("redis+cluster", "rediss+cluster")

    @property
    def prefix(self):
        """Every key of the team starts with this; the braces keep a team's keys in one slot of
        a Redis Cluster."""
        return f"relay:{{{self.team}}}:"


def _userinfo(url):
    """(scheme://, userinfo or None, the rest): the user part ends at the last `@` before the
    path, so a password holding an unencoded `/`, `?`, `#` or `@` is still all of it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", None, url
    at = rest.rfind("@")
    if at < 0:
        return scheme + sep, None, rest
    return scheme + sep, rest[:at], rest[at + 1:]


def redact(url):
    """The URL with any password hidden, whatever characters it holds (and any `password=` in
    its query)."""
    if not isinstance(url, str):
        return "?"
    head, info, rest = _userinfo(url)
    if info is not None:
        user, colon, _ = info.partition(":")
        rest = f"{user}:***@{rest}" if colon else f"{user}@{rest}"
    out = head + rest
    return re.sub(r"(?i)(password=)[^&]*", r"\1***", out)


def default_node(root, host=None):
    """<host>-<6 hex digits of the project root's path>: stable across restarts, different for
    two projects on one machine."""
    host = host or socket.gethostname() or "node"
    clean = re.sub(r"[^A-Za-z0-9._-]", "-", host.split(".")[0]).strip("-._")[:48] or "node"
    return f"{clean}-{hashlib.sha256(str(root).encode()).hexdigest()[:6]}"


def _name(value, key):
    if not isinstance(value, str) or not NAME.match(value):
        raise ValueError(f"{key} {value!r} is not a valid name ({NAME_RULE})")
    return value


def _url(value):
    if not isinstance(value, str) or not value:
        raise ValueError(f"url {value!r} is not a Redis URL (redis://host:6379 or rediss://user:password@host)")
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError:
        raise ValueError(f"url {redact(value)!r} is not a Redis URL") from None
    _, info, _ = _userinfo(value)
    if info is not None and info != parts.netloc.rpartition("@")[0]:
        raise ValueError(f"url {redact(value)!r}: the password holds a character that ends it in a URL; write "
                         f"{', '.join(f'{k} as {v}' for k, v in RESERVED.items())} (percent-encoding)")
    try:
        bad_port = parts.scheme != "redis+sentinel" and parts.port == 0     # .port raises ValueError on a bad port
    except ValueError:
        bad_port = True
    if bad_port:
        raise ValueError(f"url {redact(value)!r} is not a Redis URL: its port is not a number from 1 to 65535")
    if parts.scheme in SCHEMES:
        _query(value, parts)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ValueError(f"url {redact(value)!r} must be redis://host[:port][/db], rediss://... (TLS) or "
                         "redis+sentinel://host:26379[,host:port...]/service or redis+cluster://host:port (rediss+cluster:// "
                         "with TLS), with user:password@ for an ACL user")
    return value


# The query parameters a federation URL may hold (redis-py's, relay's own for Sentinel).
QUERY = {"db", "socket_timeout", "socket_connect_timeout", "socket_keepalive", "health_check_interval",
         "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_ca_data", "ssl_certfile", "ssl_keyfile", "ssl_password",
         "ssl_check_hostname", "ssl_min_version", "ssl_ciphers", "sentinel_password", "sentinel_username"}


def _query(value, parts):
    """The URL's query parameters checked by name: an unknown one, or TLS parameters on a URL
    without TLS, is an error naming it (never a traceback at the first connection)."""
    try:
        names = [k for k, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))]
    except ValueError:
        raise ValueError(f"url {redact(value)!r}: its query is not name=value pairs") from None
    for name in names:
        if name not in QUERY:
            raise ValueError(f"url {redact(value)!r}: unknown parameter {name!r} (known: {', '.join(sorted(QUERY))})")
        if name.startswith("ssl_") and not parts.scheme.startswith("rediss") and parts.scheme != "redis+sentinel":
            raise ValueError(f"url {redact(value)!r}: {name} needs TLS: rediss:// (or rediss+cluster://)")


def warnings(federation):
    """What a working configuration should still be told (logged at start, shown by doctor)."""
    if federation.url is None:
        return []
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(federation.url).query))
    out = []
    if query.get("ssl_cert_reqs", "").lower() in ("none", "optional"):
        out.append(f"ssl_cert_reqs={query['ssl_cert_reqs']} in the federation url: the server's TLS certificate is "
                   "NOT verified; anyone on the path can read and forge the team's traffic. Give ssl_ca_certs= instead")
    return out


def parse(value, root, parse_duration):
    """A Federation from the section's table; ValueError naming the key otherwise."""
    if not isinstance(value, dict):
        raise ValueError("must be a table ([federation] with url, team and node)")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    if "team" not in value:
        raise ValueError("'team' is missing")
    heartbeat = parse_duration(value.get("heartbeat", "5s"))
    if heartbeat <= 0:
        raise ValueError("heartbeat must be more than 0s")
    ack_timeout = parse_duration(value.get("ack_timeout", "30s"))
    if ack_timeout <= 0:
        raise ValueError("ack_timeout must be more than 0s")
    limit = value.get("max_agents_per_node", 4096)
    try:
        limit = int(limit)
    except (TypeError, ValueError):
        limit = 0
    if limit <= 0:
        raise ValueError(f"max_agents_per_node {value.get('max_agents_per_node')!r} must be a whole number above 0")
    node = value.get("node") or default_node(root)
    url = value.get("url")         # an agent's verbs need none: the daemon's ledger knows the team
    return Federation(url=None if url in (None, "") else _url(url), team=_name(value["team"], "team"),
                      node=_name(node, "node"),
                      heartbeat=heartbeat, ack_timeout=ack_timeout, max_agents_per_node=limit)
