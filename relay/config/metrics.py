"""The [metrics] table of relay.toml: `listen = "127.0.0.1:9108"` makes `relay run` serve
/metrics (the Prometheus text format) on that address alone, for a scraper (web/scrape.py).
Read here, at the bottom with the rest of the configuration; config/__init__.py takes it.

The endpoint asks for no token (a scraper holds none), so where it listens is the operator's
word: a port alone (`9108`, `:9108`) means loopback; a loopback address is taken as written; a
host name other than localhost is refused (it could resolve anywhere); and another address
(`0.0.0.0:9108`, `10.0.0.5:9108`) only when written out as an IP address, which the daemon's log
names at start."""
import dataclasses
import ipaddress

from relay.terminal import unsafe

DEFAULT_PORT = 9108


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    listen: str             # as written in relay.toml (or RELAY_METRICS)
    host: str               # an IP address
    port: int               # 0: a free one (the log names it)

    @property
    def loopback(self):
        return ipaddress.ip_address(self.host).is_loopback


def address(text):
    """(host, port) of a listen address: "HOST:PORT", "[V6]:PORT", ":PORT" or "PORT" (loopback)."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, as [::1]:{DEFAULT_PORT}")
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r} names no port (HOST:PORT, as 127.0.0.1:{DEFAULT_PORT})")
    if host in ("", "localhost"):
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{text!r}: the host is an IP address or localhost (a name could resolve to any "
                         "address, and /metrics asks for no token)") from None
    return host, int(port)


def parse(value):
    """[metrics]: a table with listen; a string (RELAY_METRICS) is the listen address."""
    if isinstance(value, str):
        value = {"listen": value}
    if not isinstance(value, dict):
        raise ValueError(f"{value!r} is not a table ([metrics] with listen = \"127.0.0.1:{DEFAULT_PORT}\")")
    unknown = sorted(set(value) - {"listen"})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} in [metrics] (its key: listen)")
    listen = value.get("listen")
    if isinstance(listen, int) and not isinstance(listen, bool):
        listen = str(listen)
    if listen in (None, ""):
        return None
    if not isinstance(listen, str) or any(unsafe(c) for c in listen):
        raise ValueError(f"[metrics] listen = {listen!r} is not an address (HOST:PORT)")
    host, port = address(listen)
    return MetricsConfig(listen, host, port)
