"""The house rules that keep each concern in its own module and layer, checked on the source."""
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


# relay bench's probe of one commit's cost, on a database of its own (never the ledger's tables).
OWN_DATABASE = {PACKAGE / "bench" / "commitprobe.py"}


def outside_the_ledger():
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.parent.name != "ledger" and p not in OWN_DATABASE]


def test_sql_is_written_only_in_the_ledger_package():
    """Writes are in relay/ledger/ledger.py and the parts it holds, reads in history.py and its
    parts, the schema in schema.py; no module outside relay/ledger/ holds a statement."""
    found = offences(outside_the_ledger(), SQL)
    assert not found, "SQL outside relay/ledger/:\n" + "\n".join(found)


def test_no_module_reaches_into_the_ledger():
    """Other modules use the Ledger's and the History's methods, never their connection or a
    private member."""
    found = offences(outside_the_ledger(), [LEDGER_INSIDES])
    assert not found, "a private part of the ledger used outside it:\n" + "\n".join(found)


def test_the_ledger_imports_nothing_from_core_and_records_its_own_outcome_records():
    """relay/ledger/ knows rows and its own records (ledger/outcome.py's OutcomeRecord, which the
    pipeline builds at the boundary), not the pipeline's working object (core/work.py's Work)."""
    ledger = sorted((PACKAGE / "ledger").rglob("*.py"))
    imported = [f"{p.relative_to(PACKAGE.parent)}: relay.{m}" for p in ledger for m in relay_imports(p)
                if m == "core" or m.startswith("core.")]
    assert not imported, "the ledger imports core:\n" + "\n".join(imported)
    worked = [f"{p.relative_to(PACKAGE.parent)}:{n}: {line.strip()}" for p in ledger for n, line in lines(p)
              if re.search(r"core[/.]work\b|\bw\.(got|outcome|missed|shed)\b", line)]
    assert not worked, "the ledger reads the pipeline's Work:\n" + "\n".join(worked)


# Each package's layer: a module imports only from its own layer or lower ones (configuration
# and errors at the bottom, used by all), at the top of the module or inside a function.
LAYERS = {"": 0, "config": 0, "files": 1, "ledger": 2, "core": 3, "agent": 4, "operator": 4, "federation": 4, "service": 5,
          "bench": 5, "web": 5, "cli": 6}


def relay_imports(path):
    """The relay modules a file imports (dotted, without 'relay.'), wherever the import stands."""
    import ast
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "relay":
                out |= {a.name for a in node.names}
            elif node.module.startswith("relay."):
                out.add(node.module[len("relay."):])
        elif isinstance(node, ast.Import):
            out |= {a.name[len("relay."):] for a in node.names if a.name.startswith("relay.")}
    return out


def module_of(path):
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def layer(module):
    top = module.split(".")[0]
    if top == "service":
        return LAYERS["service"]
    return LAYERS.get(top, 0) if top in LAYERS else 0


def test_lower_layers_never_import_upper_ones():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = module_of(path)
        if here in ("", "__main__"):            # the package's facade and python -m relay
            continue
        for target in relay_imports(path):
            if layer(target) > layer(here):
                found.append(f"{here} (layer {layer(here)}) imports {target} (layer {layer(target)})")
    assert not found, "\n".join(found)


def test_no_import_circle():
    """Between the modules (the package facade aside), wherever the imports stand."""
    paths = {module_of(p): p for p in PACKAGE.rglob("*.py") if module_of(p) not in ("", "__main__")}
    graph = {m: {t for t in relay_imports(p) if t in paths and t != m} for m, p in paths.items()}
    # a package imports its modules' names through __init__: an edge to a package means its __init__
    seen, stack, circles = set(), [], []

    def visit(m):
        if m in stack:
            circles.append(" -> ".join(stack[stack.index(m):] + [m]))
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for t in sorted(graph[m]):
            visit(t)
        stack.pop()
    for m in sorted(graph):
        visit(m)
    assert not circles, "\n".join(circles)


def test_no_module_over_about_five_hundred_lines():
    big = [f"{p.relative_to(PACKAGE.parent)}: {n}" for p in sorted(PACKAGE.rglob("*.py"))
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500]
    assert not big, "split by concern:\n" + "\n".join(big)


def test_no_function_over_eighty_lines():
    """A function (or method) longer than 80 lines does several things: cut it into named steps."""
    import ast
    long = [f"{p.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for p in sorted(PACKAGE.rglob("*.py")) for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80]
    assert not long, "cut into named steps:\n" + "\n".join(long)


def test_every_package_says_what_it_holds():
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = __import__("ast").get_docstring(__import__("ast").parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc) > 80, f"{init.relative_to(PACKAGE.parent)} has no docstring saying what it holds"


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
    Relay(fsync=..., sync_mode=...), relay.ledger.messages.record, conftest.failing_create), never
    through a private name."""
    tests = [p for p in sorted(TESTS.glob("*.py")) if p.name != "test_house.py"]     # not its own patterns
    found = [f"tests/{p.name}:{n}: {line.strip()}" for p in tests for n, line in lines(p)
             if any(pat.search(line) for pat in PRIVATE_PATCHES)]
    assert not found, "a test patches a private name:\n" + "\n".join(found)


# words that say when (or in which round) a test file was written, not what it tests
WHEN_WRITTEN = re.compile(r"(smaller|typos|daily|review|seed|round\d*|issue\d*|item\d*|misc|new|extra|more|fixes|todo)")


def test_no_test_file_is_named_for_when_it_was_written():
    """A test lives in the file of the concern it tests (test_config.py, test_cli.py, ...): a file
    named for when it was written (test_smaller.py, test_review_seed.py, test_issue27.py), or whose
    docstring begins with the issue it came from, says nothing of what it holds."""
    import ast
    found = []
    for p in sorted(TESTS.glob("test_*.py")):
        found += [f"tests/{p.name}: named for when it was written ({word})"
                  for word in p.stem.removeprefix("test_").split("_") if WHEN_WRITTEN.fullmatch(word)]
        doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or ""
        if re.match(r"(issue|round|item)\s*#?\d+", doc, re.I):
            found.append(f"tests/{p.name}: its docstring begins {doc.split(':')[0]!r}, not with what it tests")
    assert not found, "name a test file for the concern it tests:\n" + "\n".join(found)


# watchdog's documented modules: its events, observers and their API, and the platform observers
PUBLIC_WATCHDOG = {"watchdog", "watchdog.events", "watchdog.observers", "watchdog.observers.api",
                   "watchdog.observers.inotify", "watchdog.observers.polling", "watchdog.utils"}


def test_watchdog_is_used_through_its_documented_modules():
    """A private module of watchdog's (inotify_c, inotify_move_event_grouper, ...) can move in any
    release; relay imports only the documented ones, so an upgrade fails a test, not silently."""
    import ast
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.relative_to(PACKAGE.parent)}: {n}" for n in names
                      if n.split(".")[0] == "watchdog" and n not in PUBLIC_WATCHDOG]
    assert not found, "a private watchdog module imported:\n" + "\n".join(found)


def test_the_code_cites_the_contract_that_is_in_the_repository():
    """The contract is docs/contract.md ("contract §N"): a SPEC.md outside the repository is no
    reference a reader can follow."""
    found = [f"{p.relative_to(PACKAGE.parent)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
             for n, line in lines(p) if re.search(r"\bSPEC\b(?! *=)", line) and "SUSPECT" not in line]
    assert not found, "cite docs/contract.md as 'contract §N':\n" + "\n".join(found)
    contract = (PACKAGE.parent / "docs" / "contract.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+)\. ", contract, re.M))
    cited = {m for p in PACKAGE.rglob("*.py") for m in re.findall(r"contract §(\d+)", p.read_text(encoding="utf-8"))}
    assert cited and cited <= sections, f"cited sections {sorted(cited - sections)} are not in docs/contract.md"


def classes_in_the_package():
    """(module path, class node) of every class in relay/."""
    import ast
    return [(p.relative_to(PACKAGE.parent), node) for p in sorted(PACKAGE.rglob("*.py"))
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(node, ast.ClassDef)]


def test_no_class_has_more_than_three_bases():
    """A class built of many bases is a mixin soup: compose parts instead (ledger/part.py)."""
    found = [f"{path}: {node.name} has {len(node.bases)} bases" for path, node in classes_in_the_package()
             if len(node.bases) > 3]
    assert not found, "\n".join(found)


def test_the_ledger_and_history_are_composed_of_parts_not_mixins():
    """Ledger and History derive from nothing but object: they hold their parts (ledger.messages,
    ledger.state, history.remote, ...), each a Part (ledger/part.py) on the store's one
    connection that says in its constructor what else it uses; no class of the ledger uses
    attributes it never declares ("uses self.db, ...")."""
    import ast
    import inspect
    from relay.ledger.history import History
    from relay.ledger.ledger import Ledger
    from relay.ledger.part import Part
    for store in (Ledger, History):
        assert store.__bases__ == (object,), f"{store.__name__} derives from {store.__bases__}"
    built = inspect.getsource(Ledger._parts) + inspect.getsource(History.__init__)
    parts = re.findall(r"self\.(\w+) = (\w+)\(self\b", built)
    assert len(parts) >= 20, parts
    modules = {n: m for p in (PACKAGE / "ledger").glob("*.py")
               for n, m in [(p.stem, __import__(f"relay.ledger.{p.stem}", fromlist=["_"]))]}
    kinds = {cls for m in modules.values() for name, cls in vars(m).items() if name in dict(parts).values()}
    assert kinds and all(issubclass(cls, Part) for cls in kinds), [c for c in kinds if not issubclass(c, Part)]
    mixed = [f"{path}: {node.name}" for path, node in classes_in_the_package()
             if path.parent.name == "ledger" and "uses self." in (ast.get_docstring(node) or "")]
    assert not mixed, "a class of the ledger that uses attributes it does not declare:\n" + "\n".join(mixed)
