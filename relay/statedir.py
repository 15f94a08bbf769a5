"""Where the project and its state directory are: the root as every verb finds it (like git),
the state directory below it, and the refusal of one reached through a symbolic link or lying
where agents write. config/__init__.py takes these names from here (config.discover, ...)."""
import os
import stat
from pathlib import Path

from relay.errors import ConfigError, NotInProject


def absolute(path):
    """`path` made absolute, as named (a link in it kept); one that holds '..' as the kernel takes
    it: '..' after a symbolic link is the parent of the link's target, which no lexical
    normalisation gives (a unit or a hook would otherwise name another directory than relay uses)."""
    path = Path(path).absolute()
    return Path(os.path.realpath(path)) if ".." in path.parts else path


def resolve_dirs(root=None, state_dir=None, env=None):
    """The project root and state directory from flags, then env, then defaults."""
    env = os.environ if env is None else env
    root = absolute(root or env.get("RELAY_ROOT") or os.getcwd())
    state = state_dir or env.get("RELAY_STATE_DIR") or None
    return root, (root / state if state else None)


def discover(root=None, state_dir=None, env=None, cwd=None, uid=None):
    """The project root as every verb finds it, like git: `root` (a flag) or RELAY_ROOT when
    given, else the current directory or its nearest parent holding the state directory
    (`.relay/`, or the name given by `state_dir` / RELAY_STATE_DIR). NotInProject when none.

    A state directory found so must belong to the user relay runs as (`uid`, default the
    effective uid), as git asks of a `.git` it finds: one another user put in a shared parent
    (/tmp, a team directory) would otherwise receive this user's messages and configure this
    user's relay. NotInProject names it; `--root` uses it on purpose."""
    env = os.environ if env is None else env
    uid = os.geteuid() if uid is None else uid
    given = root or env.get("RELAY_ROOT")
    if given:
        return absolute(given)
    name = state_dir or env.get("RELAY_STATE_DIR") or ".relay"
    start = Path(cwd or os.getcwd()).absolute()
    if Path(name).is_absolute():
        return start
    for place in (start, *start.parents):
        if (place / name).is_dir():
            owners = {os.lstat(place / name).st_uid, os.stat(place / name).st_uid}
            if owners != {uid}:
                other = min(owners - {uid})
                e = NotInProject(f"{place / name} belongs to another user (uid {other}), so relay does not take it "
                                 f"for your project; run relay init here for one of your own, or give --root "
                                 f"{place} to use it on purpose")
                e.foreign = place
                raise e
            return place
    raise NotInProject(f"not in a relay project (no {name.rstrip('/')}/ here or above); run relay init")


def state_parts(root, state):
    """The components of the state directory's path below the project root, when it lies there
    (named relative to the root, or absolute under it) and holds no '..'; else None: a place
    elsewhere (an operator's --state-dir or RELAY_STATE_DIR) is taken as it is named."""
    root, state = Path(root), Path(state)
    n = len(root.parts)
    if state.parts[:n] != root.parts or ".." in state.parts[n:]:
        return None
    return state.parts[n:]


def state_link(root, state):
    """The first symbolic link on the way from the project root down to the state directory
    (the state directory itself included), or None. Components not made yet end the look:
    Layout.create makes them without following a link."""
    here = Path(root)
    for part in state_parts(root, state) or ():
        here = here / part
        try:
            if stat.S_ISLNK(os.lstat(here).st_mode):
                return here
        except FileNotFoundError:
            return None
        except OSError:
            return None         # (not a directory, no permission: making or opening it says so)
    return None


def linked(state, link, origin):
    """The refusal of a state directory reached through a link: agents can write in the project
    and plant one, and relay would then keep its ledger and deliver mail outside the project."""
    return ConfigError(f"the state directory {state} ({origin}) is reached through the symbolic link {link}; "
                       "relay never follows a link to its state directory inside the project (an agent can "
                       "plant one): remove the link, or name the place it points to with --state-dir or "
                       "RELAY_STATE_DIR (a place outside the project is yours to name)")


def check_state(root, state, origin):
    link = state_link(root, state)
    if link is not None:
        raise linked(state, link, origin)
    parts = state_parts(root, state)
    if parts is not None and (not [p for p in parts if p != "."] or
                              (len(parts) > 1 and parts[0] == ".relay")):
        raise ConfigError(f"the state directory {state} ({origin}) is the project root itself, or lies inside "
                          "the default state directory .relay/ (where agents write: outboxes and inboxes); "
                          "name a directory of its own")
