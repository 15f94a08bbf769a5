"""Team state for a team's coordinator: a small durable key/value table in the ledger (save, get,
delete, get all), with compare-and-set so that two agents cannot both take one key. The
Project's `state_get`, `state_set`, `state_delete` and `state_list` (TeamState, mixed into
project.Project) and the Agent's, which act in the agent's name (AgentState, mixed into
api.Agent); `relay state` is built on them.

    me.state_set("build-lock", "Alice: release 2.1", if_absent=True)   # StateConflict if held
    entry = me.state_get("build-lock")                                  # a StateEntry, or None
    me.state_set("plan", new_text, if_version=entry.version)            # only if unchanged since
    me.state_delete("build-lock", if_version=entry.version)

A key is 1 to 128 characters: letters, digits, `.`, `_`, `-`, `:` and `/`, starting with a
letter or a digit. A value is text, at most 64 KiB in UTF-8 (JSON is text: json.dumps it). Every
change is a ledger event with who made it (ledger/state.py)."""
import dataclasses
import logging

from relay.config import SYSTEM
from relay.core.message import iso
from relay.errors import InvalidName, NotFound, RelayError, StateConflict
from relay.ledger.rows import BadRow
from relay.ledger.state import KEY, KEY_RULE, MAX_VALUE_BYTES
from relay.terminal import unsafe

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StateEntry:
    """One key of the team state: its `value` (text), its `version` (up by one at each change),
    when (epoch seconds) and by whom it was last set."""
    key: str
    value: str
    version: int
    updated_at: float
    updated_by: str

    @classmethod
    def of(cls, row):
        return cls(key=row["key"], value=row["value"], version=row["version"], updated_at=row["updated_at"],
                   updated_by=row["updated_by"])

    def as_dict(self):
        return {"key": self.key, "value": self.value, "version": self.version, "updated_at": iso(self.updated_at),
                "updated_by": self.updated_by}


def check_key(key):
    """`key` when it is a team state key; RelayError naming the rule else."""
    if not isinstance(key, str) or KEY.match(key) is None:
        shown = key if isinstance(key, str) else type(key).__name__
        raise RelayError(f"invalid state key {shown!r:.140}: a key is 1 to 128 characters matching {KEY_RULE} "
                         "(letters, digits, '.', '_', '-', ':' and '/', starting with a letter or digit)")
    return key


def check_value(value):
    """`value` when it is text of at most MAX_VALUE_BYTES in UTF-8; RelayError else."""
    if not isinstance(value, str):
        raise RelayError(f"a state value is text, not {type(value).__name__} (JSON: json.dumps it first)")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise RelayError("a state value must be valid Unicode text (it holds a lone surrogate)") from None
    if size > MAX_VALUE_BYTES:
        raise RelayError(f"the state value is {size} bytes, over the {MAX_VALUE_BYTES} (64 KiB) a key holds; "
                         "keep large data in a file and store its path")
    return value


def check_version(version, what="if_version"):
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
        raise RelayError(f"{what} is a version, a whole number 1 or more, not {version!r}")
    return version


def check_actor(actor):
    """Who makes a change, as events name it: one line of 1 to 200 characters."""
    if not isinstance(actor, str) or not 0 < len(actor) <= 200 or any(unsafe(c) for c in actor):
        raise RelayError(f"the actor of a state change is 1 to 200 characters on one line, not {actor!r:.80}")
    return actor


def held(key, entry):
    return f"state key {key!r} is at version {entry['version']}, set by {entry['updated_by']} at " \
           f"{iso(entry['updated_at'])}"


class TeamState:
    """Project's part for the team state (uses self.writing, self.history, self.clock)."""

    def state_get(self, key):
        """The StateEntry of `key`, or None when it has no value."""
        check_key(key)
        history = self.history()
        if history is None:
            return None
        with history:
            row = history.state.get(key)
        if row is None:
            return None
        bad = BadRow.of(row, "team_state")
        if bad is not None:
            raise RelayError(str(bad).replace("; skipped", ""))
        return StateEntry.of(row)

    def state_list(self, prefix=None):
        """Every key that has a value (those starting with `prefix`), by key, as StateEntries.
        A row this build cannot read is left out (and logged)."""
        history = self.history()
        if history is None:
            return []
        with history:
            rows = history.state.entries(prefix)
        out = []
        for row in rows:
            bad = BadRow.of(row, "team_state")
            if bad is None:
                out.append(StateEntry.of(row))
            else:
                log.warning("%s", bad)
        return out

    def state_set(self, key, value, *, actor, if_version=None, if_absent=False):
        """Set `key` to `value` in the name of `actor`; returns the new StateEntry. With
        `if_absent`, only when the key has no value; with `if_version`, only when its value has
        that version now: otherwise StateConflict, naming the version there and who set it, and
        nothing changes."""
        check_key(key)
        check_value(value)
        check_version(if_version)
        check_actor(actor)
        if if_absent and if_version is not None:
            raise RelayError("give if_absent or if_version, not both")
        with self.writing() as ledger:
            done, row = ledger.state.set(key, value, self.clock(), actor, if_version=if_version,
                                         if_absent=bool(if_absent))
        if done:
            return StateEntry.of(row)
        if if_absent:
            raise StateConflict(f"{held(key, row)}; not set (it was to be set only if absent)", key, None,
                                StateEntry.of(row))
        if row is None:
            raise StateConflict(f"state key {key!r} has no value (version {if_version} was expected); not set",
                                key, if_version, None)
        raise StateConflict(f"{held(key, row)}, not version {if_version}; not set", key, if_version,
                            StateEntry.of(row))

    def state_delete(self, key, *, actor, if_version=None):
        """Delete `key` in the name of `actor`; returns its StateEntry as it was. NotFound when
        it has no value; with `if_version`, StateConflict when its value has another version
        now (nothing changes)."""
        check_key(key)
        check_version(if_version)
        check_actor(actor)
        with self.writing() as ledger:
            done, row = ledger.state.delete(key, self.clock(), actor, if_version=if_version)
        if done:
            return StateEntry.of(row)
        if row is None:
            raise NotFound(f"state key {key!r} has no value; nothing deleted")
        raise StateConflict(f"{held(key, row)}, not version {if_version}; not deleted", key, if_version,
                            StateEntry.of(row))


class AgentState:
    """Agent's part for the team state: the Project's, in this agent's name (uses self.name,
    self.project)."""

    def state_get(self, key):
        """The StateEntry of `key`, or None when it has no value."""
        return self.project.state_get(key)

    def state_list(self, prefix=None):
        """Every key that has a value (those starting with `prefix`), by key."""
        return self.project.state_list(prefix)

    def state_set(self, key, value, if_version=None, *, if_absent=False):
        """Set `key` to `value` as this agent (Project.state_set: StateConflict when the
        condition does not hold)."""
        return self.project.state_set(key, value, actor=self._state_actor(), if_version=if_version,
                                      if_absent=if_absent)

    def state_delete(self, key, if_version=None):
        """Delete `key` as this agent (Project.state_delete)."""
        return self.project.state_delete(key, actor=self._state_actor(), if_version=if_version)

    def _state_actor(self):
        if self.name == SYSTEM:
            raise InvalidName(f"{SYSTEM!r} is relay's own name; only agents change the team state")
        return self.name
