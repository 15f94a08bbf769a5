"""Search: full text over the subjects and bodies an agent may see (its own inbox and what it
sent), newest first, with snippets; an FTS5 index in the ledger, written in the batch's own
record transaction (and with a message received from another node), its body text capped, its
rows swept with their messages. `relay search`, Agent.search and MCP search() alike."""
import json
import sqlite3
import time

import anyio
import pytest

import relay
from conftest import error_line
from mcp_client import ToolFailed, deliver, serve
from relay.ledger.history import History
from relay.ledger.ledger import Ledger
from relay.ledger.search import BODY_CHARS, MAX_QUERY_BYTES, MAX_TERMS, match


def test_this_python_has_fts5():
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(a)")


@pytest.fixture
def mail(cli, project):
    """Alice, Bob, Carol: Bob sees a1 (to him), b1 (his own) and a3 (a broadcast), not a2."""
    cli("init", "--agent", "Alice", "--agent", "Bob", "--agent", "Carol")
    with relay.Agent("Alice", root=project.root) as alice, relay.Agent("Bob", root=project.root) as bob:
        project.a1 = alice.send("Bob", "The parser fails on unicode input: see tests/test_parse.py",
                                subject="parser bug", thread="parse-7")
        deliver(project, ("Alice", "Bob", "Carol"))
        project.b1 = bob.send("Alice", "I will fix the parser today", subject="Re: parser bug", thread="parse-7")
        project.a2 = alice.send("Carol", "the parser is fine for Carol", subject="private parser note")
        project.a3 = alice.send("*", "lunch at noon, then the parser review", subject="today")
        deliver(project, ("Alice", "Bob", "Carol"))
    project.cli = cli
    return project


def ids(docs):
    return [d["id"] for d in docs]


def test_an_agent_finds_what_it_may_see_newest_first_with_snippets(mail):
    cli = mail.cli
    docs = json.loads(cli("search", "parser", "--agent", "Bob", "--json").output)
    assert ids(docs) == [mail.a3, mail.b1, mail.a1]                     # not a2: Carol's
    first = docs[-1]
    assert {k: first[k] for k in ("from", "to", "thread", "subject")} == {
        "from": "Alice", "to": ["Bob"], "thread": "parse-7", "subject": "parser bug"}
    assert "**parser**" in first["snippet"] and first["sent_at"]
    assert ids(json.loads(cli("search", "parser", "--agent", "Carol", "--json").output)) == [mail.a3, mail.a2]
    # filters: sender, thread (a thread named by its first message's id holds it), time
    assert ids(json.loads(cli("search", "parser", "--agent", "Bob", "--from", "Bob", "--json").output)) == [mail.b1]
    assert ids(json.loads(cli("search", "parser", "--agent", "Bob", "--thread", "parse-7", "--json").output)) == [
        mail.b1, mail.a1]
    assert ids(json.loads(cli("search", "parser", "--agent", "Bob", "--since", "1h", "--json").output)) == [
        mail.a3, mail.b1, mail.a1]
    assert json.loads(cli("search", "parser", "--agent", "Bob", "--since", "2999-01-01", "--json").output) == []
    # every word must be there, in any order, any case; "a phrase"; a prefix*
    assert ids(json.loads(cli("search", "UNICODE parser", "--agent", "Bob", "--json").output)) == [mail.a1]
    assert ids(json.loads(cli("search", '"parser review"', "--agent", "Bob", "--json").output)) == [mail.a3]
    assert ids(json.loads(cli("search", "pars*", "--agent", "Bob", "--limit", "1", "--json").output)) == [mail.a3]
    # what FTS5 would read as syntax is text here
    assert ids(json.loads(cli("search", 'tests/test_parse.py "unicode', "--agent", "Bob", "--json").output)) == [
        mail.a1]
    assert json.loads(cli("search", "parser NOT fine OR (", "--agent", "Bob", "--json").output) == []
    # without --agent: every message (the operator's view)
    assert ids(json.loads(cli("search", "parser", "--json").output)) == [mail.a3, mail.a2, mail.b1, mail.a1]
    text = cli("search", "unicode", "--agent", "Bob").output
    assert mail.a1 in text and "Alice -> Bob" in text and "parser bug" in text and "**unicode**" in text
    assert cli("search", "nothing-like-this", "--agent", "Bob").output == "no messages match\n"
    r = cli("search", '" - "', "--agent", "Bob", ok=False)
    assert r.exit_code == 1 and error_line(r) == "nothing to search for in '\" - \"': give a word"
    r = cli("search", "parser", "--agent", "bob", ok=False)
    assert "did you mean Bob?" in error_line(r)


def test_python_searches_as_the_agent(mail):
    with relay.Agent("Carol", root=mail.root) as carol:
        found = carol.search("parser")
        assert ids(found) == [mail.a3, mail.a2]
        assert ids(carol.search("parser", sender="Alice", limit=1)) == [mail.a3]
        assert carol.search("parser", since=time.time() + 60) == []
        assert ids(carol.search("parser", since="1h")) == [mail.a3, mail.a2]
        with pytest.raises(relay.RelayError):
            carol.search("parser", since="yesterday-ish")
    assert ids(relay.Project(mail.root).search("parser", agent="Bob")) == [mail.a3, mail.b1, mail.a1]


def test_the_index_is_written_with_the_batch_capped_and_swept_with_its_messages(cli, project):
    cli("init", "--agent", "Alice", "--agent", "Bob")
    far = "word " * (BODY_CHARS // 5) + "needle"                # past the cap: not indexed
    with relay.Agent("Alice", root=project.root) as alice:
        near, long_ = alice.send("Bob", "haystack then pin"), alice.send("Bob", far, subject="long one")
        mid = alice.send("Bob", "sent, not yet relayed: pin")
        with Ledger(project.state / "ledger.sqlite", readonly=True) as led:
            assert History(led).search.messages("pin") == []                     # in the outbox: not in the ledger yet
        r = project.relay(agents=("Alice", "Bob"))
        r.drain()
        with Ledger(project.state / "ledger.sqlite", readonly=True) as led:
            history = History(led)
            assert ids(history.search.messages("pin")) == [mid, near]
            assert history.search.messages("needle") == [] and ids(history.search.messages("long")) == [long_]
            assert history.search.size() == 3
        # the retention sweep takes the index rows with their messages
        project.clock.advance(8 * 86400)
        assert r.sweep_all().archived == 3
        with Ledger(project.state / "ledger.sqlite", readonly=True) as led:
            history = History(led)
            assert history.search.messages("pin") == [] and history.search.size() == 0


def test_a_message_received_from_another_node_is_indexed(tmp_path):
    now = time.time()
    item = {"id": "01KC3000000000000000000001", "sender": "Ann", "name": "msg", "node": "n2", "entry_id": "1-0",
            "recipients": ["Bob"], "kind": "message", "thread": None, "subject": "from afar",
            "body": "a remote haystack", "headers": "{}", "sha256": "0" * 64, "sent_at": now,
            "delivered": {"Bob": (10, "1" * 64)}}
    with Ledger(tmp_path / "ledger.sqlite") as led:
        led.remote.received(now, [item], [])
        found = History(led).search.messages("haystack", agent="Bob")
        assert ids(found) == [item["id"]] and found[0]["sender"] == "Ann"
        assert History(led).search.messages("haystack", agent="Carol") == []


def test_a_ledger_from_before_the_index_is_indexed_when_it_is_migrated(cli, project):
    cli("init", "--agent", "Alice", "--agent", "Bob")
    with relay.Agent("Alice", root=project.root) as alice:
        mid = alice.send("Bob", "an old message about kites")
    deliver(project)
    path = project.state / "ledger.sqlite"
    db = sqlite3.connect(path)          # the ledger as the previous version left it
    db.executescript("DROP TABLE search; DROP TABLE search_docs; DELETE FROM schema_migrations WHERE version = 30;")
    db.close()
    with Ledger(path) as led:
        assert ids(History(led).search.messages("kites", agent="Bob")) == [mid]


def test_mcp_search_is_the_callers_view(mail, tmp_path):
    async def main():
        with open(tmp_path / "server.err", "w") as err:
            async with serve(mail.root, "Bob", err) as bob:
                tools = await bob.tools()
                assert "Marks nothing read" in tools["search"].description
                got = await bob.call("search", query="parser")
                assert ids(got["results"]) == [mail.a3, mail.b1, mail.a1]
                assert "**parser**" in got["results"][0]["snippet"]
                got = await bob.call("search", query="parser", thread="parse-7", limit=1)
                assert ids(got["results"]) == [mail.b1]
                got = await bob.call("search", query="parser", sender="Alice", since="1h")
                assert ids(got["results"]) == [mail.a3, mail.a1]
                with pytest.raises(ToolFailed) as e:
                    await bob.call("search", query="--")
                assert e.value.args[0].endswith("nothing to search for in '--': give a word")
    anyio.run(main)
    assert "Traceback" not in (tmp_path / "server.err").read_text()


def test_a_query_past_its_bounds_is_refused_with_the_bound_in_the_cli_python_and_mcp(mail, tmp_path):
    cli = mail.cli
    words = " ".join(f"w{i}" for i in range(MAX_TERMS + 1))                   # 65 words, under 1,000 bytes
    r = cli("search", words, "--agent", "Bob", ok=False)
    assert r.exit_code == 1 and error_line(r) == (
        f"a search query holds at most {MAX_TERMS} words; this one has {MAX_TERMS + 1}")
    huge = "ab " * 40_000                                                       # 120 KB, 40,000 words
    r = cli("search", huge, "--agent", "Bob", ok=False)
    assert r.exit_code == 1 and error_line(r) == (
        f"a search query is at most {MAX_QUERY_BYTES:,} bytes; this one is 120,000")
    with relay.Agent("Bob", root=mail.root) as bob:
        with pytest.raises(relay.RelayError, match=f"at most {MAX_QUERY_BYTES:,} bytes"):
            bob.search(huge)
        with pytest.raises(relay.RelayError, match=f"at most {MAX_TERMS} words"):
            bob.search(words)
    with pytest.raises(relay.RelayError, match="at most"):                     # no ledger yet is no way round it
        relay.Project(tmp_path / "elsewhere").search(huge)

    async def main():
        with open(tmp_path / "server.err", "w") as err:
            async with serve(mail.root, "Bob", err) as bob:
                with pytest.raises(ToolFailed) as e:
                    await bob.call("search", query=huge)
                assert e.value.args[0].endswith(f"at most {MAX_QUERY_BYTES:,} bytes; this one is 120,000")
    anyio.run(main)
    assert "Traceback" not in (tmp_path / "server.err").read_text()


def test_a_query_just_under_its_bounds_is_answered(mail):
    cli = mail.cli
    at_bytes = "parser" + " " * (MAX_QUERY_BYTES - len("parser"))             # 1,000 bytes exactly
    assert ids(json.loads(cli("search", at_bytes, "--agent", "Bob", "--json").output)) == [mail.a3, mail.b1, mail.a1]
    at_terms = " ".join(["parser"] * (MAX_TERMS - 1) + ["unicode"])             # 64 words
    assert ids(json.loads(cli("search", at_terms, "--agent", "Bob", "--json").output)) == [mail.a1]


def test_a_query_is_measured_in_utf8_bytes():
    assert match("é" * (MAX_QUERY_BYTES // 2))                                  # 1,000 bytes
    with pytest.raises(relay.RelayError, match="this one is 1,002$"):
        match("é" * (MAX_QUERY_BYTES // 2 + 1))


def test_the_work_a_query_gives_the_index_grows_linearly_and_not_with_repeats():
    """What FTS5 is given for n and 2n words: its terms and its text grow with the distinct words
    (no more than twice), and a word said again adds nothing (FTS5's cost for an AND of
    matching terms grows with their square)."""
    def distinct(n):
        return " ".join(f"w{i:03d}" for i in range(n))
    for n in (8, 16, 32):
        small, large = match(distinct(n)), match(distinct(2 * n))
        assert small.count(" AND ") == n - 1 and large.count(" AND ") == 2 * n - 1
        assert len(large) <= 2 * len(small) + len(" AND ")
        assert match(" ".join(["parser"] * n)) == match(" ".join(["parser"] * 2 * n)) == '"parser"'
    assert match('parser "a b" pars* PARSER "a b" pars*') == '"parser" AND "a b" AND "pars"*'


@pytest.mark.parametrize("query, expr", [
    ("Parser parser PARSER", '"Parser"'),
    ("pars* pars", '"pars"* AND "pars"'),
    ('"pars*"', '"pars*"'),
    ('"unclosed phrase', '"unclosed phrase"'),
    ('say"hi', '"say""hi"'),
    ("-- parser ** !!", '"parser"'),
    ("é*", '"é"*'),
])
def test_a_querys_terms_are_quoted_once_each_a_prefix_only_outside_a_phrase(query, expr):
    assert match(query) == expr


@pytest.mark.parametrize("query", ["", None, "   ", "***", '""', "-- !! ..", '"  " *'])
def test_a_query_with_no_word_is_refused_naming_it(query):
    with pytest.raises(relay.RelayError, match="nothing to search for in .*: give a word"):
        match(query)


@pytest.mark.parametrize("terms, ok", [(MAX_TERMS, True), (MAX_TERMS + 1, False)])
def test_a_query_of_up_to_64_terms_phrases_counted_as_one_is_read(terms, ok):
    query = " ".join(['"a b"'] + [f"w{i}" for i in range(terms - 1)])
    if ok:
        assert match(query).count(" AND ") == terms - 1
    else:
        with pytest.raises(relay.RelayError, match=f"at most {MAX_TERMS} words; this one has {terms}"):
            match(query)


@pytest.mark.parametrize("value, at", [("2026-11-30", 1795996800.0), ("2026-11-30T10:00", 1796032800.0),
                                       ("2026-11-30T10:00Z", 1796032800.0), ("2026-11-30T10:00+01:00", 1796029200.0),
                                       (5, 5), (5.5, 5.5), (None, None)])
def test_a_since_of_the_api_is_an_instant_a_date_without_a_zone_being_utc(value, at):
    from relay.agent.project import instant
    assert instant(value) == at


@pytest.mark.parametrize("value", [True, "600", "soon", [1], "2026-13-01"])
def test_a_since_of_the_api_that_is_neither_a_date_nor_a_duration_is_refused_saying_so(value):
    from relay.agent.project import instant
    with pytest.raises(relay.RelayError) as e:
        instant(value)
    assert str(e.value) == f"{value!r} is neither a date (2026-11-30, 2026-11-30T10:00) nor a duration (90s, 15m, 12h, 7d)"


def test_a_thread_named_by_its_first_messages_id_holds_that_message_and_the_replies(mail):
    with relay.Agent("Alice", root=mail.root) as alice, relay.Agent("Bob", root=mail.root) as bob:
        first = alice.send("Bob", "a parser question with no thread", subject="question")
        deliver(mail, ("Alice", "Bob", "Carol"))
        answer = bob.reply(first, "the parser answer")
        deliver(mail, ("Alice", "Bob", "Carol"))
    found = json.loads(mail.cli("search", "parser", "--agent", "Bob", "--thread", first, "--json").output)
    assert ids(found) == [answer, first]
    assert found[0]["thread"] == first and found[1]["thread"] is None


def test_a_search_limit_is_a_whole_number_1_or_more_in_python(mail):
    with relay.Agent("Bob", root=mail.root) as bob:
        for bad in (0, -1, True, "3", 1.5, None):
            with pytest.raises(relay.RelayError) as e:
                bob.search("parser", limit=bad)
            assert str(e.value) == f"the limit must be a whole number of messages, 1 or more, not {bad!r}"
        assert len(bob.search("parser", limit=1)) == 1


def test_a_message_with_a_subject_and_no_body_is_found_by_its_subject_and_one_with_neither_is_not_indexed(
        cli, project):
    cli("init", "--agent", "Alice", "--agent", "Bob")
    with relay.Agent("Alice", root=project.root) as alice:
        titled = alice.send("Bob", "", subject="standup notes")
        alice.send("Bob", "")
        bodied = alice.send("Bob", "standup moved to ten")
    project.relay(agents=("Alice", "Bob")).drain()
    with Ledger(project.state / "ledger.sqlite", readonly=True) as led:
        history = History(led)
        assert ids(history.search.messages("standup")) == sorted([titled, bodied], reverse=True)
        assert history.search.size() == 2
