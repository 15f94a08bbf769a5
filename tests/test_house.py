"""The house rules that keep each concern in its room, checked on the source."""
import re
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "relay"
TESTS = Path(__file__).parent

SQL = [re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE)\b.*\b(FROM|INTO|SET)\b"),
       re.compile(r"\bPRAGMA\b"),
       # with a statement: a Redis pipeline's execute() has none (or only raise_on_error=)
       re.compile(r"\.execute(many|script)?\((?!\)|raise_on_error=)")]
LEDGER_INSIDES = re.compile(r"\b(ledger|led|history)\._\w+|\b(ledger|led)\.db\b")


def lines(path):
    return enumerate(path.read_text(encoding="utf-8").splitlines(), 1)


def offences(paths, patterns):
    return [f"{p.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
            for p in paths for n, line in lines(p) if any(pat.search(line) for pat in patterns)]


def test_sql_is_written_only_in_the_ledger_and_the_history():
    """Writes are in ledger.py and the rooms it mixes in (ledger_*.py; its schema in schema.py),
    reads in history.py; no other module holds a statement."""
    others = [p for p in sorted(PACKAGE.glob("*.py"))
              if p.name not in ("ledger.py", "history.py", "schema.py") and not p.name.startswith("ledger_")]
    found = offences(others, SQL)
    assert not found, "SQL outside relay/ledger.py and relay/history.py:\n" + "\n".join(found)


def test_no_module_reaches_into_the_ledger():
    """Other modules use the Ledger's and the History's methods, never their connection or a
    private member."""
    others = [p for p in sorted(PACKAGE.glob("*.py")) if p.name not in ("ledger.py", "history.py")]
    found = offences(others, [LEDGER_INSIDES])
    assert not found, "a private part of the ledger used outside it:\n" + "\n".join(found)


def test_the_package_exports_its_public_api():
    import relay
    from relay import errors
    foreseen = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.RelayError)}
    assert foreseen <= set(relay.__all__)
    assert {"Config", "load", "Relay", "Counts", "Status", "__version__"} <= set(relay.__all__)
    assert all(getattr(relay, name, None) is not None for name in relay.__all__)


PRIVATE_PATCHES = [re.compile(r"""\bsetattr\([^,]+,\s*["']_"""),        # monkeypatch.setattr(x, "_name", ...)
                   re.compile(r"""\bsetattr\(["'][\w.]*\._"""),          # monkeypatch.setattr("mod._name", ...)
                   re.compile(r"\.\_[A-Za-z]\w*\s*=(?!=)")]             # x._name = ...


def test_no_test_patches_a_private_name():
    """Tests change behaviour through the seams that exist (relay.fs, relay.syncer.fsync,
    Relay(fsync=..., sync_mode=...), relay.ledger.record, conftest.failing_create), never
    through a private name."""
    tests = [p for p in sorted(TESTS.glob("*.py")) if p.name != "test_house.py"]     # not its own patterns
    found = [f"tests/{p.name}:{n}: {line.strip()}" for p in tests for n, line in lines(p)
             if any(pat.search(line) for pat in PRIVATE_PATCHES)]
    assert not found, "a test patches a private name:\n" + "\n".join(found)
