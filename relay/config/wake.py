"""The [wake] table of relay.toml (core/wake.py): relay types a notice line into each agent's
tmux pane. Read here, at the bottom with the rest of the configuration; config/__init__.py takes it."""
import dataclasses

from relay.terminal import unsafe


@dataclasses.dataclass(frozen=True)
class WakeConfig:
    tmux: str = None        # the tmux target, "{agent}" replaced by the agent's name
    socket: str = None      # the tmux server's socket (tmux -S); None: tmux's own choice


def parse(value):
    """[wake]: a table with tmux (the target) and socket; a string (RELAY_WAKE) is the target."""
    if isinstance(value, str):
        value = {"tmux": value}
    if not isinstance(value, dict):
        raise ValueError(f"{value!r} is not a table ([wake] with tmux = \"agents:{{agent}}\")")
    unknown = sorted(set(value) - {"tmux", "socket"})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} in [wake] (its keys: tmux, socket)")
    for key, text in value.items():
        if not isinstance(text, str) or any(unsafe(c) for c in text):
            raise ValueError(f"[wake] {key} = {text!r} is not plain text")
    return WakeConfig(value.get("tmux") or None, value.get("socket") or None)
