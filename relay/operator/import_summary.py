"""What a run of `relay import agent-relay` did (or, with --dry-run, would do): the summary the
importer (operator/importer.py) fills, printed as lines or as JSON."""
import dataclasses

from relay.ledger.agent_relay import STATUSES

SOURCE = "agent-relay"
BECOMES = {"archived": "archived", "delivered": "archived", "failed": "failed", "processing": "pending",
           "pending": "pending"}


@dataclasses.dataclass
class Summary:
    """What a run did (or, with dry_run, would do)."""
    ledger: str
    root: str
    dry_run: bool = False
    imported: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(STATUSES, 0))    # by status there
    became: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(("archived", "failed", "pending"), 0))
    found: str = None           # which ledger was taken, and where (when it was looked for)
    without_file: int = 0       # archived with no archive file (accept_missing)
    duplicates: int = 0         # records of an outbox file an earlier record holds: one message
    skipped: int = 0            # imported by an earlier run
    agents: list = dataclasses.field(default_factory=list)
    registry: list = dataclasses.field(default_factory=list)     # names written into the agent registry
    state: list = dataclasses.field(default_factory=list)
    state_skipped: int = 0      # keys this ledger has already
    state_note: str = None      # why no state came over
    problems: list = dataclasses.field(default_factory=list)     # not imported: a human must look
    notices: list = dataclasses.field(default_factory=list)      # imported, with something to know

    def doc(self):
        return {"source": SOURCE, "ledger": self.ledger, "found": self.found, "root": self.root,
                "dry_run": self.dry_run, "imported": self.imported, "became": self.became,
                "duplicates": self.duplicates, "without_file": self.without_file,
                "skipped": {"already_imported": self.skipped}, "agents": self.agents, "registry": self.registry,
                "state": {"imported": self.state, "skipped": self.state_skipped, "note": self.state_note},
                "problems": self.problems, "notices": self.notices, "ok": not self.problems}

    def lines(self):
        verb = "would import" if self.dry_run else "imported"
        out = [f"ledger found: {self.found}"] if self.found else []
        out.append(f"{verb} from agent-relay {self.ledger}:")
        for status in STATUSES:
            n = self.imported[status]
            then = " (relay delivers them)" if BECOMES[status] == "pending" else ""
            out.append(f"  {status:<10} {n:>6} -> {BECOMES[status]}{then}")
        if self.duplicates:
            out.append(f"  {self.duplicates} of them record(s) of an outbox file an earlier record holds: "
                       "recorded as its duplicates, one message, delivered once")
        if self.without_file:
            out.append(f"  {self.without_file} of them archived without their archive file (--accept-missing)")
        out.append(f"skipped (imported before): {self.skipped}")
        out.append(f"agents: {len(self.agents)} added or updated" + (f" ({', '.join(self.agents)})" if self.agents else ""))
        if self.registry:
            out.append(f"agent registry: {len(self.registry)} agent(s) with agent-relay's status and metadata "
                       f"({', '.join(self.registry)}; relay agents shows them)")
        if self.state_note:
            out.append(f"orchestrator state: not imported: {self.state_note}")
        else:
            out.append(f"orchestrator state: {len(self.state)} key(s) imported, {self.state_skipped} already set here")
        out += [f"notice: {n}" for n in self.notices]
        out += [f"problem: {p}" for p in self.problems]
        return out
