"""What a sender writes never drives the operator's terminal: every verb, run on a project whose
messages, names, headers and files are made of terminal escapes (OSC 52 sets the clipboard, OSC 8
forges a link, CSI clears the screen), C1 controls (U+0080-U+009F) and bidi overrides, prints
none of them raw, on stdout or stderr; JSON output keeps every value exact through JSON escapes
(C1 controls, bidi overrides and the line separators escaped too, which JSON allows)."""
import json
import os

import pytest
from click.testing import CliRunner

from relay.cli import main

OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"                       # the clipboard set to `rm -rf ~`
OSC8 = "\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\"
CSI = "\x1b[2J\x1b[31m"
C1 = "\x9b2J\x9d0;title\x9c\x85\x8d\x90\x9f\x80"
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u2028\u2029"
OTHER = "\r\x08\x00\x7f\x0b\x0c"
HOSTILE = OSC52 + OSC8 + CSI + C1 + BIDI + OTHER + "end"

# Every raw character that must not reach a terminal (newline and tab may).
UNSAFE = ({chr(c) for c in range(0x20)} - {"\n", "\t"}) | {"\x7f"} | {chr(c) for c in range(0x80, 0xA0)} | set(BIDI)


def raw(text):
    """The unsafe characters of `text`, as their code points."""
    return sorted({f"U+{ord(c):04X}" for c in text if c in UNSAFE or 0xD800 <= ord(c) <= 0xDFFF})


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A project after one run over hostile messages: (root, ids, runner)."""
    root = tmp_path_factory.mktemp("hostile")
    runner = CliRunner()

    def run(*args, input=None):
        return runner.invoke(main, ["--root", str(root), *args], input=input, catch_exceptions=False)

    assert run("init", "--agent", "Ann", "--agent", "Bob").exit_code == 0
    state = root / ".relay"
    box = state / "outbox" / "Ann"
    (box / "json-msg").write_text(json.dumps({
        "to": "Bob", "subject": HOSTILE, "thread": "t" + HOSTILE, "body": "line one\n" + HOSTILE + "\nlast",
        "x-" + HOSTILE: HOSTILE, "kind": "message", "ack_required": True}))
    (box / "header-msg").write_text(f"TO: Bob\nSUBJECT: {HOSTILE}\nTHREAD: plain\nX-EVIL: {HOSTILE}\n\n{HOSTILE}")
    (box / "spawn").write_text(json.dumps({"name": "Cy" + HOSTILE, "cli": HOSTILE, "cwd": HOSTILE,
                                           "model": HOSTILE}))
    (box / "nobody").write_text(json.dumps({"to": "Nobody", "subject": HOSTILE, "body": HOSTILE}))
    (box / ("name" + C1 + BIDI.replace("\u2028", "").replace("\u2029", ""))).write_text("TO: Bob\n\nby name")
    os.close(os.open(os.path.join(os.fsencode(box), b"bad\x1b]52;c;eA==\x07\xff"), os.O_CREAT | os.O_WRONLY, 0o644))
    (state / "outbox" / ("x" + OSC52)).mkdir()                # an outbox no agent may have
    first = run("run", "--once")
    assert first.exit_code == 0, first.output
    new = state / "inbox" / "Bob" / "new"
    (new / ("planted" + OSC52 + ".json")).write_text(json.dumps({"subject": HOSTILE}))
    ids = sorted(r["id"] for r in json.loads(run("audit", "--json").stdout))
    assert len(ids) >= 5
    return root, ids, run, first


def invocations(ids, bobs=()):
    """Each verb's runs, human output first: {verb: [args, ...]}; a verb with --json runs with it
    too. `bobs`: the ids of the messages in Bob's inbox."""
    first = ids[0]
    return {
        "init": [["--agent", "Ann"]],
        "run": [["--once"]],
        "send": [["--from", "Ann", "--to", "Bob", "--subject", "ok", "plain"],
                 ["--from", "Bob", "--reply-to", first, "reply"]],
        "inbox": [["Bob"], ["Bob", "--all"], ["Bob", "--json"], ["Bob", "--jsonl"], ["Bob", "--all", "--ack"]],
        "read": [[i] for i in ids] + [[first, "--json"]],
        "mark-read": [["--agent", "Bob", *ids]],
        # (RELAY_ACK_OVERDUE=1ms: the hostile message asking for an acknowledgement is listed overdue)
        "overdue": [[], ["--json"], ["--agent", "Ann"], ["--agent", "Ann", "--json"]],
        "ack": [[i, "--agent", "Bob", "--note", "n" + HOSTILE] for i in ids] + [[i, "--agent", "Bob", "--json"] for i in bobs],
        "search": [["line"], ["last", "--agent", "Bob"], ["line", "--json"], ["t" + HOSTILE], [HOSTILE, "--agent", "Bob"]],
        "status": [[], ["--json"]],
        "audit": [[], ["--thread", "t" + HOSTILE], ["--grep", "end"], ["--status", "failed"], ["--json"],
                  ["--jsonl"], ["--format", "csv"]],
        "show": [[i] for i in ids] + [[i, "--json"] for i in ids] + [["--path", "outbox/Ann/m\x1b[31mred\u202e\x07\x9b"]],
        "state": [["set", "k1", "v" + HOSTILE, "--as", "Ann"], ["get", "k1"], ["get", "k1", "--json"], ["list"],
                  ["list", "--json"], ["set", "x" + HOSTILE, "v"], ["delete", "k1", "--if-version", "7"],
                  ["delete", "k1"]],
        "commands": [[], ["--json"]],
        "import": [["agent-relay", "no-such" + HOSTILE]],
        "tail": [["-n", "1000"], ["-n", "1000", "--json"]],
        "verify": [[], ["--json"]],
        "doctor": [[], ["--json"]],
        "agents": [[], ["--json"]],
        "queues": [[], ["--json"]],
        "config": [[], ["--json"]],
        "report": [["--html", "report.html"]],
        "sweep": [["--dry-run"], ["--dry-run", "--json"]],
        "service": [["systemd", "--user"], ["launchd", "--user"]],
        "federation": [["acl", "n1", "--team", "acme", "--password", "x"]],
        "adopt": [["Bob"]],
        "hook": [["claude", "--agent", "Bob"], ["install", "claude", "--agent", "Bob"], ["uninstall", "claude"]],
        "ping": [["Bob"], ["Bob", "--json"]],
        "retry": [ids, ["--failed"], ["--failed", "--json"]],
        "expire": [[i] for i in ids] + [[first, "--json"]],
        "archive-agent": [["Ann"], ["Ann", "--undo", "--json"]],
        "reserve": [["--agent", "Ann", "src", "--exclusive", "--reason", "plain"], ["--agent", "Bob", "src/x"],
                    ["--agent", "Bob", "x" + HOSTILE], ["--agent", "Bob", "y", "--reason", HOSTILE]],
        "reservations": [[], ["--json"]],
        "guard": [["check", "--agent", "Bob", "src/x" + HOSTILE]],
        "release": [["--agent", "Ann", "src", "z" + HOSTILE], ["--agent", "Ann", "--all"]],
    }


NOT_RUN = {
    "demo": "runs over a copy of examples/outboxes in a project of its own, never this one",
    "bench": "measures a temporary project of its own, never this one",
    "mcp": "speaks JSON-RPC on stdio to an MCP client program, not to a terminal",
    "web": "serves HTTP until stopped, to a browser, not to a terminal (test_web holds its pages' escaping)",
}


def test_every_verb_prints_no_raw_escape_control_or_bidi_character(hostile, monkeypatch):
    root, ids, run, first = hostile
    monkeypatch.chdir(root)
    monkeypatch.setenv("RELAY_ACK_OVERDUE", "1ms")
    bobs = [d["id"] for d in json.loads(run("inbox", "Bob", "--all", "--json").stdout) if d["id"] in ids]
    assert bobs
    table = invocations(ids, bobs)
    assert set(main.commands) == set(table) | set(NOT_RUN), "a verb to run here on the hostile project"
    leaks = [f"relay run --once (the first, with its log): {stream} has {raw(text)}"
             for stream, text in (("stdout", first.stdout), ("stderr", first.stderr)) if raw(text)]
    for verb, runs in table.items():
        for args in runs:
            r = run(verb, *args)
            assert "Traceback" not in r.output and r.exit_code in (0, 1, 3, 4), (verb, args, r.output)
            for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
                if raw(text):
                    leaks.append(f"relay {verb} {' '.join(map(repr, args))}: {stream} has {raw(text)}")
            if "--json" in args or "--jsonl" in args:
                # (str.splitlines() would split at U+0085 and U+2028 too: JSON output escapes both)
                for line in r.stdout.splitlines() if "--jsonl" in args or verb == "tail" else [r.stdout]:
                    try:
                        json.loads(line)        # still JSON, one document a line, whatever it holds
                    except ValueError as e:
                        leaks.append(f"relay {verb} {' '.join(map(repr, args))}: not JSON lines ({e})")
    assert not leaks, "\n".join(leaks)


def test_a_hostile_relay_toml_is_named_escaped_in_errors_and_warnings(cli):
    cli("init", "--agent", "Ann")
    (cli.state / "relay.toml").write_text(f"{json.dumps('unknown' + OSC8)} = {json.dumps(HOSTILE)}\n"
                                          f"retention = {json.dumps(HOSTILE)}\n")
    said = ""
    for args in (["run", "--once"], ["status"], ["config"], ["inbox", "Ann"], ["send", "--from", "Ann", "--to",
                                                                                 "Ann", "x"]):
        r = cli(*args, ok=False)
        said += r.stderr
        assert not raw(r.stdout) and not raw(r.stderr), (args, r.output)
    assert "unknown" in said and "retention" in said


def test_relay_config_and_its_warnings_write_no_control_character_to_the_terminal(cli, monkeypatch):
    """relay config printed each value as written: a C1 escape or a bidi override in relay.toml
    (which agents can write) or in the name of an environment variable reached the operator's
    terminal as it was (an 8-bit CSI clears the screen, U+202E turns the line around)."""
    cli("init", "--agent", "Ann")
    (cli.state / "relay.toml").write_text('on_deliver = "echo \\u009b2Jcleared \\u202eevil"\n')
    monkeypatch.setenv("RELAY_X\u202eY", "1")
    r = cli("config")
    assert "cleared" in r.stdout and "evil" in r.stdout and "RELAY_X" in r.stderr
    for c in ("\x9b", "\u202e"):
        assert c not in r.stdout and c not in r.stderr
    assert json.loads(cli("config", "--json").stdout)["values"]["on_deliver"]["value"] == "echo \x9b2Jcleared \u202eevil"


def test_json_keeps_each_value_exact_through_escapes(hostile):
    root, ids, run, _ = hostile
    shown = [json.loads(run("show", i, "--json").stdout) for i in ids]
    [doc] = [d for d in shown if d["body"] == "line one\n" + HOSTILE + "\nlast"]
    assert doc["subject"] == HOSTILE and doc["thread"] == "t" + HOSTILE
    assert doc["headers"] == {"x-" + HOSTILE: HOSTILE}
    text = run("show", doc["id"], "--json").stdout
    assert "\\u009b" in text and "\\u202e" in text and "\\u2028" in text and "\\u001b" in text
    [line] = [ln for ln in run("audit", "--jsonl").stdout.splitlines() if doc["id"] in ln]
    assert json.loads(line)["subject"] == HOSTILE


def test_the_gate_shows_each_unsafe_character_as_an_escape():
    from relay import terminal
    assert terminal.escaped("a\x1b[31mb\x9bc\u202ed\n\te\udcff") == "a\\x1b[31mb\\x9bc\\u202ed\n\te\\xff"
    assert terminal.escaped("a\nb", keep="") == "a\\x0ab"
    assert terminal.spaced("a\x1b\x9b\u202e\n\tb") == "a     b"
    assert json.loads(terminal.json_text({"k": HOSTILE})) == {"k": HOSTILE}
    assert not raw(terminal.json_text({"k": HOSTILE}))


def test_the_cli_prints_only_through_the_gate():
    """Every verb prints with terminal.echo / echo_json (and click's error line, which the group
    passes through the gate): no other way out to a terminal in the CLI's modules."""
    import re
    from pathlib import Path
    package = Path(__file__).parent.parent / "relay"
    other = re.compile(r"\bclick\.(s?echo|secho)\(|\bprint\(|sys\.std(out|err)\.write|orjson\.dumps")
    found = [f"{p.name}:{n}: {line.strip()}" for p in sorted(package.glob("cli*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if other.search(line)]
    assert not found, "printed past the gate:\n" + "\n".join(found)


def test_a_table_row_stays_one_line_whatever_its_cells_hold(cli):
    """A subject and a thread with a newline and ESC: in `relay audit`'s table each is one cell
    on the message's one row, the newline a space and ESC shown as `\\e`."""
    cli("init", "--agent", "Ann", "--agent", "Bob")
    (cli.state / "outbox" / "Ann" / "m").write_text(json.dumps(
        {"to": "Bob", "subject": "two\nlines\x1b[31m", "thread": "t\nu", "body": "x"}))
    cli("run", "--once")
    [mid] = [r["id"] for r in json.loads(cli("audit", "--json").stdout)]
    [row] = [line for line in cli("audit").stdout.splitlines() if mid in line]
    assert row.endswith("two lines\\e[31m") and " t u " in row


def test_a_log_line_shows_each_unsafe_character_of_what_it_logs_as_an_escape():
    """The daemon's text log passes each line through the gate, whatever a caller put in it."""
    import logging

    from relay.cli.context import JsonFormatter, TextFormatter
    record = logging.LogRecord("relay", logging.WARNING, __file__, 1, "left %s", (CSI + "x\u202e",), None)
    assert TextFormatter("%(levelname)s %(message)s").format(record) == "WARNING left \\x1b[2J\\x1b[31mx\\u202e"
    line = JsonFormatter().format(record)
    assert not raw(line) and json.loads(line)["msg"] == "left " + CSI + "x\u202e"


@pytest.mark.parametrize("code, bad", [
    (0x00, True), (0x1F, True), (0x20, False), (0x7E, False), (0x7F, True), (0x80, True), (0x9F, True), (0xA0, False),
    (0x061B, False), (0x061C, True), (0x061D, False), (0x200D, False), (0x200E, True), (0x200F, True), (0x2010, False),
    (0x2027, False), (0x2028, True), (0x2029, True), (0x202A, True), (0x202E, True), (0x202F, False),
    (0x2065, False), (0x2066, True), (0x2069, True), (0x206A, False), (0xFEFF, False),
])
def test_each_end_of_every_unsafe_range_is_where_the_gate_says(code, bad):
    from relay import terminal
    char = chr(code)
    assert terminal.unsafe(char) is bad
    shown = terminal.escaped(f"a{char}b", keep="")
    assert shown == (f"a\\x{code:02x}b" if code < 0x100 else f"a\\u{code:04x}b") if bad else shown == f"a{char}b"
    assert terminal.spaced(f"a{char}b") == ("a b" if bad else f"a{char}b")
    assert json.loads(terminal.json_text({"k": char})) == {"k": char}
    assert (char in terminal.json_text({"k": char})) is (not bad)        # DEL in an ASCII document too


def test_escaped_keeps_newline_and_tab_unless_told_and_shows_undecodable_bytes_as_bytes():
    from relay import terminal
    assert terminal.escaped("a\nb\tc\x1b") == "a\nb\tc\\x1b"
    assert terminal.escaped("a\nb\tc", keep="") == "a\\x0ab\\x09c"
    assert terminal.escaped("a\nb\tc", keep="\t") == "a\\x0ab\tc"
    assert terminal.escaped("caf\udce9") == "caf\\xe9" and terminal.escaped("\ud800") == "\\ud800"
    assert terminal.escaped(None) == "" and terminal.escaped(5) == "5" and terminal.escaped("é") == "é"
    assert terminal.spaced(None) == "" and terminal.spaced("caf\udce9\ud800") == "caf  "


def test_an_id_says_the_millisecond_it_was_made_at_and_ids_of_one_generator_never_go_back():
    from relay.ids import ALPHABET, IdGenerator, id_time
    gen = IdGenerator()
    first = gen.new(1796032800.1234)
    assert len(first) == 26 and set(first) <= set(ALPHABET) and id_time(first) == 1796032800.123
    same = gen.new(1796032800.1236)                     # the same millisecond: the next id
    earlier = gen.new(1796032799.0)                     # a clock gone back: still after
    later = gen.new(1796032801.0)
    assert first < same < earlier < later and id_time(same) == id_time(earlier) == 1796032800.123
    assert id_time(later) == 1796032801.0 and same[:10] == first[:10]
    assert id_time("0000000000") == 0 and id_time("0000000001") == 0.001 and id_time("000000000Z") == 0.031
