"""Where agent-relay keeps its ledger, for `relay import agent-relay [PATH]`.

Two names, in this order: the daemon of agent-relay 2.0.29 (`@agent-relay/daemon`) has its
watchdog keep the ledger at `<relayDir>/meta/file-ledger.sqlite`, its relayDir the project's
`.agent-relay`; the watchdog on its own (the library's RelayWatchdog, its default) keeps it at
`<its directory>/meta/ledger.sqlite`, that directory `$AGENT_RELAY_DATA_DIR`, else
`$XDG_DATA_HOME/agent-relay` when XDG_DATA_HOME is set, else `~/.agent-relay`.

PATH is the ledger file, a directory holding `meta/<name>`, or a project holding `.agent-relay`.
Without PATH the project's `.agent-relay` is looked in, then the library's places. The first
ledger found is taken, and one line says which (and names any other found: give it as PATH to
import it on its own)."""
import dataclasses
import os
from pathlib import Path

from relay.errors import RelayError

META = "meta"
NAMES = (("file-ledger.sqlite", "agent-relay daemon's meta/file-ledger.sqlite"),
         ("ledger.sqlite", "agent-relay watchdog's meta/ledger.sqlite"))


@dataclasses.dataclass(frozen=True)
class Found:
    ledger: Path                # the ledger file
    root: Path                  # agent-relay's directory (the one holding meta/)
    said: str = None            # which was taken, where, and what else was found; None: PATH named the file


def places(project, env):
    """(directory, what it is) where agent-relay keeps its ledger, looked in without PATH."""
    out = [(Path(project) / ".agent-relay", "the project's .agent-relay")]
    if env.get("AGENT_RELAY_DATA_DIR"):
        out.append((Path(env["AGENT_RELAY_DATA_DIR"]), "$AGENT_RELAY_DATA_DIR"))
    if env.get("XDG_DATA_HOME"):
        out.append((Path(env["XDG_DATA_HOME"]) / "agent-relay", "$XDG_DATA_HOME/agent-relay"))
    out.append((Path(env.get("HOME") or os.path.expanduser("~")) / ".agent-relay", "~/.agent-relay"))
    seen = set()                # each directory once (the project may be the home directory)
    return [(d, what) for d, what in out if not (str(d) in seen or seen.add(str(d)))]


def _first(dirs):
    """Found for the first ledger in `dirs` ((directory, what it is or None)); None when none is."""
    found = [(d / META / name, d, label, what) for d, what in dirs for name, label in NAMES
             if (d / META / name).is_file()]
    if not found:
        return None
    ledger, d, label, what = found[0]
    said = f"{ledger} ({label}, in {f'{what} = {d}' if what else d})"
    others = list(dict.fromkeys(str(f[0]) for f in found[1:] if f[0] != ledger))
    if others:
        said += f"; also found: {', '.join(others)} (give {'it' if len(others) == 1 else 'one'} as PATH to import it)"
    return Found(ledger, d, said)


def locate(path, project, env=None):
    """The Found of PATH (None: looked for where agent-relay keeps it). RelayError saying where
    it looked when there is none."""
    env = os.environ if env is None else env
    names = " and ".join(f"{META}/{n}" for n, _ in NAMES)
    if path is None:
        dirs = places(project, env)
        found = _first(dirs)
        if found is None:
            raise RelayError(f"no agent-relay ledger found: looked for {names} in "
                             f"{', '.join(str(d) for d, _ in dirs)}; give its path (relay import agent-relay PATH)")
        return found
    p = Path(path).expanduser().absolute()
    if not p.exists():
        raise RelayError(f"{path}: no such file or directory (give agent-relay's ledger, its directory "
                         "or the project holding .agent-relay)")
    if p.is_dir():
        found = _first([(p, None), (p / ".agent-relay", None)])
        if found is None:
            raise RelayError(f"no agent-relay ledger in {path}: looked for {names} there and in .agent-relay "
                             "(give the ledger file if it lies elsewhere)")
        return found
    return Found(p, p.parent.parent if p.parent.name == META else p.parent)
