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
KEYS = ("url", "team", "node", "heartbeat")
SCHEMES = ("redis", "rediss")


@dataclasses.dataclass(frozen=True)
class Federation:
    url: str
    team: str
    node: str
    heartbeat: float = 5.0          # seconds between two directory announcements

    @property
    def shown_url(self):
        """The URL with its password hidden (for status and logs)."""
        return redact(self.url)

    @property
    def prefix(self):
        """Every key of the team starts with this; the braces keep a team's keys in one slot of
        a Redis Cluster."""
        return f"relay:{{{self.team}}}:"

    def stream(self, node):
        """The stream a node reads its incoming messages from."""
        return f"{self.prefix}in:{node}"


def redact(url):
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


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
        parts.port      # noqa: B018 - raises ValueError on a bad port
    except ValueError as e:
        raise ValueError(f"url {redact(value)!r} is not a Redis URL: {e}") from None
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ValueError(f"url {redact(value)!r} must be redis://host[:port][/db] or rediss://... (TLS), "
                         "with user:password@ for an ACL user")
    return value


def parse(value, root, parse_duration):
    """A Federation from the section's table; ValueError naming the key otherwise."""
    if not isinstance(value, dict):
        raise ValueError("must be a table ([federation] with url, team and node)")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    for key in ("url", "team"):
        if key not in value:
            raise ValueError(f"{key!r} is missing")
    heartbeat = parse_duration(value.get("heartbeat", "5s"))
    if heartbeat <= 0:
        raise ValueError("heartbeat must be more than 0s")
    node = value.get("node") or default_node(root)
    return Federation(url=_url(value["url"]), team=_name(value["team"], "team"), node=_name(node, "node"),
                      heartbeat=heartbeat)
