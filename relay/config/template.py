"""The relay.toml `relay init` writes: every key of config.KEYS commented out at its default,
each below a line of help (HELP, one for each key: a key without one is an error here, so the
file and the configuration cannot drift apart). Taking the `# ` off any `# key = value` line
gives that key its default, so the file parses back to the defaults."""
import json
from pathlib import Path

from relay import config
from relay.config.tomlfile import write_new

HEAD = """\
# relay.toml: relay's configuration for this project (docs/operating.md, "Configuration").
# Every key is commented out at its default: take the "# " off a line to set it. The environment
# (RELAY_<KEY>) overrides this file and a verb's flags override both; `relay config` shows what is
# in force and where each value came from. Durations and sizes are quoted text ("7d", "1MiB").
"""

HELP = {
    "state_dir": "where relay keeps its state, relative to the project root (--state-dir or RELAY_STATE_DIR "
                 "for any other place)",
    "retention": 'archived and failed entries older than this are swept; "0" keeps them for ever',
    "max_retries": "retries after a transient failure (disk full, permission denied) before a message fails, "
                   "and (retry_period)...",
    "retry_backoff": "the first wait before a retry; it doubles at each attempt, at most 5 min",
    "settle": "how long a file written in place must stay unchanged before relay reads it",
    "rescan_interval": "a full rescan of every outbox this often (file events are only hints)",
    "sweep_interval": "the daemon's retention sweep this often",
    "max_body_bytes": "a larger body is shed (body_size)",
    "retry_period": "...not before this long since its first failure (with max_retries)",
    "batch_bytes": "message bytes one batch holds in memory at most; the rest wait for the next batch",
    "pair_rate": "messages one sender may have delivered to one recipient per pair_window; more are shed; "
                 "0 turns it off",
    "pair_window": 'the sliding window of pair_rate; "0" turns it off',
    "queue_limit": "unread envelopes a recipient may hold in its new/; more are shed; 0 turns it off",
    "durability": '"full": fsync before any state is recorded; "normal": no fsyncs',
    "unknown_recipient": '"fail": a message to an unknown agent fails; "create": an inbox is made for it',
    "agents": 'agents known without directories (with senders = "declared", the senders too)',
    "senders": '"any": every valid directory in outbox/ sends; "declared": only the agents declared',
    "log_format": '"text", or "json" for machines',
    "log_level": '"debug", "info", "warning" or "error"',
    "on_deliver": 'a command run once per delivered envelope, off the delivery path, to wake an agent; "": none',
    "on_deliver_timeout": "an on_deliver command still running after this is killed",
    "on_deliver_system": "also run on_deliver for envelopes delivered to System",
    "bounces": "a message that fails (or is shed for some recipients) brings its sender a bounce from System",
    "ack_overdue": "an acknowledgement a message asks for (ACK: required) is overdue after this (relay overdue)",
    "wake": """\
## relay wakes each agent itself by typing one line into its tmux pane (docs/agents.md, "Waking
## agents"), once per batch: a [wake] table at the end of this file ({agent}: the agent's name):
## [wake]
## tmux = "agents:{agent}"
""",
    "metrics": """\
## relay run serves /metrics (Prometheus) on this address alone, without a token, for a scraper
## (docs/operating.md, "Metrics"): a port alone means loopback, another host only as an IP address:
## [metrics]
## listen = "127.0.0.1:9108"
""",
    "federation": """\
## teams across machines over Redis (docs/federation.md): a [federation] table at the end of
## this file (the URL, with its password, best in RELAY_FEDERATION_URL, which agents cannot read):
## [federation]
## team = "acme"
## node = "laptop"
""",
}


def _value(key, value, text):
    """The default of `key` as relay.toml writes it."""
    if key == "state_dir":
        return json.dumps(".relay")
    if value is None:                   # on_deliver: none
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and text == str(value):
        return text
    if isinstance(value, list):
        return json.dumps(value)
    return json.dumps(text)             # a duration, a size, a word


def template():
    """The text of a new relay.toml."""
    missing = [k for k in config.KEYS if k not in HELP]
    if missing:
        raise KeyError(f"no help for the configuration keys {missing} (config/template.py's HELP)")
    rows = {key: (value, text) for key, value, text, _ in
            config.describe(config.Config(root=Path("."), state_dir=Path(".relay")))}
    out = [HEAD]
    for key in config.KEYS:
        if key not in ("federation", "wake", "metrics"):
            out.append(f"## {HELP[key]}\n# {key} = {_value(key, *rows[key])}\n")
    out.append(HELP["wake"])
    out.append(HELP["metrics"])
    out.append(HELP["federation"])
    return "\n".join(out)


def write(cfg):
    """Write a new relay.toml where `cfg` reads it from, unless one is there; its path, or None."""
    if cfg.origin("state_dir").startswith("relay.toml"):
        return None         # the state directory was named by a relay.toml: there is one
    path = cfg.state_dir / "relay.toml"
    return path if write_new(path, template()) else None
