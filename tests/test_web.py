"""relay web without a browser: the token on every address, the headers that keep a page inert,
agents' hostile text rendered inert on every page, the filters, search and pages of Messages, a
message's original checked against its hash and the chain, and the refusals (bad filters, path
traversal, huge query strings). The server runs in-process on a free port."""
import html
import html.parser
import json
import re
import sys

import pytest
from mcp_client import until
from webkit import get, server

from relay.cli import main  # noqa: F401  (the CLI, for the verb's tests)

HOSTILE = [
    "<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "javascript:alert(1)",
    "<a href='javascript:alert(1)'>x</a>", "<svg onload=alert(1)>", "</textarea><b>", "<!--",
    "‮gnp.exe", "tab\tbell\x07esc\x1b[31m", "<style>body{display:none}</style>", "{{7*7}}",
]


@pytest.fixture
def web(team):
    """The team's project with a little traffic, and relay web serving it."""
    for i, bad in enumerate(HOSTILE):
        team("send", "--from", "Alice", "--to", "Bob", "--subject", bad, "--thread", f"t{i}{bad}", f"body {bad}")
    team("send", "--from", "Bob", "--to", "Zed", "--create", "to a new agent")
    team("run", "--once")
    srv = server(team.root).start()
    yield srv
    srv.stop()


def ids(text):
    return re.findall(r'data-id="([0-9A-Z]{26})"', text)


class Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


ALLOWED = {"html", "head", "meta", "title", "link", "script", "body", "header", "nav", "a", "span", "main", "h1",
           "h2", "p", "table", "tr", "th", "td", "code", "section", "div", "b", "ol", "li", "form", "label", "input",
           "select", "option", "button", "pre", "article", "time", "footer", "svg", "line", "text", "rect", "ul",
           "textarea", "fieldset", "legend"}


def assert_inert(text):
    """No tag, attribute or address came from an agent: only the page's own tags, no event
    attribute, no javascript: address, one script (the page's own file); no bidi control raw."""
    p = Tags()
    p.feed(text)
    for tag, attrs in p.tags:
        assert tag in ALLOWED, tag
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
        assert not any((v or "").strip().lower().startswith("javascript:") for v in attrs.values()), (tag, attrs)
    scripts = [a for t, a in p.tags if t == "script"]
    assert scripts == [{"src": "/static/relay.js", "defer": None}]
    assert "\u202e" not in text and "\x07" not in text and "\x1b" not in text


def test_every_address_needs_the_token(web):
    mid = ids(get(web, "/messages")[2])[0]
    for path in ("/", "/messages", f"/messages/{mid}", f"/messages/{mid}/original", "/threads/t0", "/agents",
                 "/metrics", "/events", "/static/relay.css"):
        assert get(web, path, token=None)[0] == 401, path
        assert get(web, path, token="wrong" + web.token)[0] == 401, path
        assert get(web, path + "?token=nope", token=None)[0] == 401, path
    assert get(web, "/agents")[0] == 200
    # The scheme's name is in any case (RFC 9110), the token is not, nor is another scheme taken
    for scheme, status in (("bearer ", 200), ("BEARER ", 200), ("Bearer   ", 200), ("Basic ", 401), ("Bearer", 401)):
        assert get(web, "/agents", token=None, headers={"Authorization": scheme + web.token})[0] == status, scheme
    assert get(web, "/agents", token=None, headers={"Authorization": f"Bearer {web.token.upper()}"})[0] == 401


def test_the_printed_address_signs_in_with_a_strict_httponly_cookie(web):
    status, headers, _ = get(web, f"/messages?token={web.token}&status=archived", token=None)
    assert status == 303 and headers["location"] == "/messages?status=archived"
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"relay_web_{web.port}={web.token};")
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
    assert get(web, "/messages", token=None, headers={"Cookie": f"relay_web_{web.port}={web.token}"})[0] == 200
    assert get(web, "/messages", token=None, headers={"Cookie": f"relay_web_{web.port}=x{web.token}"})[0] == 401


def test_every_answer_carries_a_policy_without_inline_script(web):
    for path in ("/", "/messages", "/agents", "/nowhere"):
        _, headers, _ = get(web, path)
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"


def test_agents_hostile_text_is_inert_on_every_page(web):
    listing = get(web, "/messages")[2]
    assert_inert(listing)
    pages = ["/", "/messages", "/agents", "/messages?q=alert", "/messages?thread=t0%3Cscript%3Ealert(1)%3C/script%3E"]
    threads = re.findall(r'href="(/threads/[^"]+)"', listing)
    assert len(threads) == len(HOSTILE)
    pages += threads + [f"/messages/{m}" for m in ids(listing)]
    for path in pages:
        status, _, text = get(web, path)
        assert status == 200, path
        assert_inert(text)
    message = get(web, f"/messages/{ids(listing)[-1]}")[2]      # the first sent: its subject, shown as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in message
    bidi = [get(web, f"/messages/{m}")[2] for m in ids(listing)]
    assert any("\\u202egnp.exe" in t for t in bidi)          # the bidi control shown, not obeyed


def test_messages_filter_search_and_pages(team):
    for i in range(55):
        team("send", "--from", "Alice", "--to", "Bob", "--subject", f"note {i}", "--thread", "many", f"word{i} common")
    team("send", "--from", "Bob", "--to", "Carol", "--subject", "unique zebra", "the zebra body")
    team("run", "--once")
    with server(team.root) as srv:
        first = get(srv, "/messages")[2]
        assert len(ids(first)) == 50
        older = re.search(r'href="([^"]+)" id="older"', first).group(1).replace("&amp;", "&")
        rest = get(srv, older)[2]
        assert len(ids(rest)) == 6 and not set(ids(rest)) & set(ids(first)) and 'id="older"' not in rest
        exact = get(srv, f"/messages?q=common&before={ids(first)[5]}")[2]        # notes 0 to 49: a page exactly
        assert len(ids(exact)) == 50 and 'id="older"' not in exact
        assert len(ids(get(srv, "/messages?from=Bob")[2])) == 1
        assert len(ids(get(srv, "/messages?agent=Carol")[2])) == 1
        assert len(ids(get(srv, "/messages?q=zebra")[2])) == 1
        assert len(ids(get(srv, "/messages?q=word7")[2])) == 1
        assert ids(get(srv, "/messages?to=Carol&status=archived")[2]) == ids(get(srv, "/messages?q=zebra")[2])
        assert ids(get(srv, "/messages?status=failed")[2]) == []
        thread = get(srv, "/threads/many")[2]
        assert len(ids(thread)) == 55 and thread.index("note 0") < thread.index("note 54")     # oldest first


def refused_text(text):
    """The words of a page's refusal (its one `refused` paragraph), unescaped."""
    return html.unescape(re.search(r'<p class="refused" id="refused">(.*?)</p>', text, re.S).group(1))


@pytest.mark.parametrize("query, words", [("status=lost", "no status 'lost'"), ("since=yesterdayish", "since:"),
                                           ("from=../etc", "invalid agent name"), ("q=%22%22", "nothing to search"),
                                           ("priority=soon", "no priority"), ("before=../../x", "not a message id")])
def test_a_filter_it_cannot_read_is_refused_in_one_line(web, query, words):
    status, _, text = get(web, f"/messages?{query}")
    assert status == 400
    assert words in refused_text(text)


def test_no_address_reaches_the_file_system(web, team):
    (team.root / "secret.txt").write_text("secret")
    for path in ("/messages/..%2F..%2Fsecret.txt/original", "/messages/../../secret.txt/original",
                 "/threads/..%2F..%2Fsecret.txt", "/static/..%2F..%2F..%2Fsecret.txt", "/static/%2e%2e/app.py",
                 "/messages?thread=../../secret.txt", "/messages?q=../../secret.txt"):
        status, _, text = get(web, path)
        assert "secret" not in text.replace("secret.txt", "") and status in (200, 400, 404), path


def test_a_huge_query_string_is_refused_before_it_is_read(web):
    status, _, text = get(web, "/messages?q=" + "a" * 10_000)
    assert status == 414 and "at most" in text


def test_the_bounds_of_a_query_string_a_filter_and_a_thread_id_each_at_their_edge(web):
    """4,096 bytes of query string, 1,000 characters of a filter or a thread id are read; one
    more is refused, saying the bound."""
    for extra, status in ((0, 200), (1, 414)):
        got, _, text = get(web, "/messages?x=" + "a" * (4094 + extra))
        assert got == status and (status == 200 or "at most 4096 bytes" in text)
    for extra, status in ((0, 200), (1, 400)):
        got, _, text = get(web, "/messages?kind=" + "k" * (1000 + extra))
        assert got == status and (status == 200 or "the filter kind is at most 1000 characters" in text)
    for extra, status in ((0, 404), (1, 400)):         # no such thread, read; or refused unread
        got, _, text = get(web, "/threads/" + "t" * (1000 + extra))
        assert got == status and (status == 404 or "a thread id is at most 1000 characters" in text)


def test_the_message_page_checks_the_original_against_its_hash_and_the_chain(web, team):
    mid = ids(get(web, "/messages?from=Alice")[2])[0]
    text = get(web, f"/messages/{mid}")[2]
    assert 'id="hash" class="ok"' in text and "hash to the recorded sha256" in text
    assert 'id="chain" class="ok"' in text
    status, headers, original = get(web, f"/messages/{mid}/original")
    assert status == 200 and "attachment" in headers["content-disposition"] and "body" in original
    archived = next((team.root / ".relay" / "archive").rglob(f"{mid}*"))
    archived.write_bytes(archived.read_bytes() + b"tampered")
    text = get(web, f"/messages/{mid}")[2]
    assert 'id="hash" class="err"' in text and "do NOT hash" in text


def _csrf(text):
    return re.search(r'name="csrf" value="([0-9a-f]{64})"', text).group(1)


def test_read_only_unless_started_with_compose(web):
    assert get(web, "/compose")[0] == 404
    assert get(web, "/compose", data=b"to=Bob&body=x", method="POST")[0] in (404, 405)


def test_compose_sends_as_the_overseer_with_csrf_and_same_origin_only(team):
    from urllib.parse import urlencode
    team("init", "--agent", "Human")
    with server(team.root, compose="Human") as srv:
        token = _csrf(get(srv, "/compose")[2])
        form = {"to": "Bob", "subject": "from a person", "body": "hello <b>Bob</b>"}
        kinds = {"Content-Type": "application/x-www-form-urlencoded"}
        assert get(srv, "/compose", data=urlencode(form).encode(), headers=kinds)[0] == 403     # no CSRF token
        wrong = urlencode({**form, "csrf": "0" * 64}).encode()
        assert get(srv, "/compose", data=wrong, headers=kinds)[0] == 403
        right = urlencode({**form, "csrf": token}).encode()
        cross = {**kinds, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
        assert get(srv, "/compose", data=right, headers=cross)[0] == 403                         # another site
        assert get(srv, "/compose", token=None, data=right, headers=kinds)[0] == 401             # no token
        status, _, text = get(srv, "/compose", data=right, headers={**kinds, "Origin": srv.base})
        assert status == 200
        mid = re.search(r'id="sent">Sent: <a href="/messages/([0-9A-Z]{26})"', text).group(1)
    team("run", "--once")
    inbox = list((team.state / "inbox" / "Bob" / "new").iterdir())
    assert len(inbox) == 1 and mid in inbox[0].name and "hello <b>Bob</b>" in inbox[0].read_text()
    assert '"from":"Human"' in inbox[0].read_text().replace(" ", "")


def test_compose_takes_the_last_value_of_a_field_given_twice(team):
    """A form whose field comes twice (a stale token first, a subject changed by a script) is
    read by its last value of each, as a browser's own form sends it last."""
    from urllib.parse import urlencode
    team("init", "--agent", "Human")
    with server(team.root, compose="Human") as srv:
        token = _csrf(get(srv, "/compose")[2])
        form = urlencode([("to", "Bob"), ("subject", "first"), ("subject", "second"), ("body", "twice"),
                          ("csrf", "0" * 64), ("csrf", token)]).encode()
        kinds = {"Content-Type": "application/x-www-form-urlencoded", "Origin": srv.base}
        assert get(srv, "/compose", data=form, headers=kinds)[0] == 200
    team("run", "--once")
    [sent] = [json.loads(p.read_bytes()) for p in (team.state / "inbox" / "Bob" / "new").iterdir()]
    assert (sent["subject"], sent["body"]) == ("second", "twice")


def test_compose_offers_every_agent_but_the_overseer_sends_to_all_and_reads_a_form_of_1_mib(team):
    """The form lists the agents, not the overseer itself; "all agents" among others sends to
    every agent; one agent alone is that agent's only. A form of exactly 1 MiB is read, one byte
    more refused (413) and nothing sent."""
    from urllib.parse import urlencode
    team("init", "--agent", "Human")
    with server(team.root, compose="Human") as srv:
        page = get(srv, "/compose")[2]
        assert re.findall(r'name="to" value="([^"]*)"', page) == ["*", "Alice", "Bob", "Carol"]
        kinds = {"Content-Type": "application/x-www-form-urlencoded", "Origin": srv.base}
        for to, body in ((["Bob"], "to Bob alone"), (["Bob", "*"], "to all")):
            form = urlencode([*(("to", n) for n in to), ("body", body), ("csrf", _csrf(page))]).encode()
            assert get(srv, "/compose", data=form, headers=kinds)[0] == 200
        for extra, status in ((0, 200), (1, 413)):
            form = urlencode([("to", "Carol"), ("body", f"{extra} over"), ("csrf", _csrf(page))]) + "&pad="
            form = (form + "x" * ((1 << 20) - len(form) + extra)).encode()
            assert get(srv, "/compose", data=form, headers=kinds)[0] == status
    team("run", "--once")
    got = {n: sorted(json.loads(p.read_bytes())["body"] for p in (team.state / "inbox" / n / "new").iterdir())
           for n in ("Alice", "Bob", "Carol")}
    assert got == {"Alice": ["to all"], "Bob": ["to Bob alone", "to all"], "Carol": ["0 over", "to all"]}


def test_compose_refuses_an_origin_that_merely_ends_with_this_host(team):
    from urllib.parse import urlencode
    team("init", "--agent", "Human")
    with server(team.root, compose="Human") as srv:
        host = srv.base.split("://", 1)[1]
        kinds = {"Content-Type": "application/x-www-form-urlencoded"}
        # ... and Origin: null (a sandboxed frame, a file:// page) unless the browser says same-origin
        for origin in (f"http://evil{host}", f"https://evil.{host}", f"ftp://{host}", f"http://{host}.evil", "null"):
            token = _csrf(get(srv, "/compose")[2])
            form = urlencode({"to": "Bob", "body": "forged", "csrf": token}).encode()
            assert get(srv, "/compose", data=form, headers={**kinds, "Origin": origin})[0] == 403, origin
        token = _csrf(get(srv, "/compose")[2])
        form = urlencode({"to": "Bob", "body": "from a page of its own", "csrf": token}).encode()
        same = {**kinds, "Origin": "null", "Sec-Fetch-Site": "same-origin"}
        assert get(srv, "/compose", data=form, headers=same)[0] == 200
        # this host served over TLS (behind a proxy that ends it): its https:// origin is its own
        token = _csrf(get(srv, "/compose")[2])
        form = urlencode({"to": "Bob", "body": "through TLS", "csrf": token}).encode()
        assert get(srv, "/compose", data=form, headers={**kinds, "Origin": f"https://{host}"})[0] == 200
    team("run", "--once")
    new = team.state / "inbox" / "Bob" / "new"
    assert sorted(json.loads(p.read_bytes())["body"] for p in new.iterdir()) == ["from a page of its own", "through TLS"]


def test_a_thread_id_holding_a_slash_is_linked_with_the_slash_quoted(team):
    """`.` and `..`, which a browser takes for dot segments of /threads/, link to /messages' filter."""
    for tid in ("x/y", "a/../b", ".", ".."):
        team("send", "--from", "Alice", "--to", "Bob", "--thread", tid, f"in {tid}")
    team("run", "--once")
    with server(team.root) as srv:
        listing = get(srv, "/messages")[2]
        pages = [listing] + [get(srv, f"/messages/{m}")[2] for m in ids(listing)]
        hrefs = [h for text in pages for h in re.findall(r'href="(/threads/[^"?]+)', text)]
        assert {"/threads/x%2Fy", "/threads/a%2F..%2Fb"} <= set(hrefs)
        assert all(h.count("/") == 2 for h in hrefs), hrefs
        status, _, text = get(srv, "/threads/a%2F..%2Fb")
        assert status == 200 and "in a/../b" in text
        dots = {h for text in pages for h in re.findall(r'href="(/messages\?thread=[^"]*)"', text)}
        assert dots == {"/messages?thread=.", "/messages?thread=.."}
        status, _, text = get(srv, "/messages?thread=..")
        [only] = ids(text)
        assert status == 200 and "in .." in get(srv, f"/messages/{only}")[2]


def _steps(history, **filters):
    """SQLite's virtual-machine steps (in hundreds) to answer one page of Messages."""
    steps = [0]

    def count():
        steps[0] += 1
    history.db.set_progress_handler(count, 100)
    try:
        assert history.web.messages(**filters) == []
    finally:
        history.db.set_progress_handler(None, 100)
    return steps[0]


def test_a_filter_matching_nothing_reads_an_index_not_every_message(tmp_path):
    """kind, since and until matching no message answer from an index: the work does not grow
    with the ledger (a walk of every message would cost tens of steps per row)."""
    from relay.bench.bench import preload_ledger
    from relay.ledger.history import History
    from relay.ledger.ledger import Ledger
    work = []
    for rows in (500, 2500):
        path = tmp_path / f"ledger{rows}.sqlite"
        ledger = Ledger(path)
        preload_ledger(ledger, rows)
        ledger.close()
        with History(Ledger(path, readonly=True)) as history:
            work.append([_steps(history, kind="nothing"), _steps(history, since=4e9), _steps(history, until=1.0),
                         _steps(history, since=1.0, until=2.0)])
    assert all(big <= small + 2 for small, big in zip(*work)), work


def test_receipts_acknowledgements_and_priority_in_the_pages(team):
    """The Overview lists the acknowledgements overdue, a message shows each recipient's receipts,
    a thread its acknowledgements in place, Messages filters by priority, /metrics counts
    relay_acks_overdue: all from the ledger's receipts."""
    import time
    asked = team("send", "--from", "Alice", "--to", "Bob,Carol", "--priority", "high", "--ack-required",
                 "--thread", "review", "--subject", "merge <b>it</b>?", "please").stdout.split()[0]
    plain = team("send", "--from", "Alice", "--to", "Bob", "--subject", "fyi", "nothing asked").stdout.split()[0]
    urgent = team("send", "--from", "Carol", "--to", "Bob", "--priority", "urgent", "now").stdout.split()[0]
    team("run", "--once")
    team("ack", asked, "--agent", "Bob", "--note", "merged <i>ok</i>")
    team("run", "--once")
    with server(team.root, clock=lambda: time.time() + 7200) as srv:     # past ack_overdue (30 minutes)
        overview = get(srv, "/")[2]
        acks = re.search(r'<section id="acks-overdue">(.*?)</section>', overview, re.S).group(1)
        assert asked in acks and "Carol" in acks and "Bob" not in acks and "merge &lt;b&gt;it&lt;/b&gt;?" in acks
        page = get(srv, f"/messages/{asked}")[2]
        assert_inert(page)
        rows = dict(re.findall(r'<tr data-recipient="(\w+)">(.*?)</tr>', page, re.S))
        assert "acknowledged" in rows["Bob"] and "merged &lt;i&gt;ok&lt;/i&gt;" in rows["Bob"]
        assert "overdue" not in rows["Bob"]         # acknowledged: no longer overdue, however long ago
        assert "acknowledged" not in rows["Carol"] and "overdue" in rows["Carol"]
        # a copy of a message that asked for no acknowledgement is never overdue
        unasked = dict(re.findall(r'<tr data-recipient="(\w+)">(.*?)</tr>', get(srv, f"/messages/{plain}")[2], re.S))
        assert list(unasked) == ["Bob"] and "overdue" not in unasked["Bob"]
        assert re.search(r"<th>priority</th><td>high</td>", page) and "acknowledgement asked" in page
        thread = get(srv, "/threads/review")[2]
        assert "acknowledged by Bob" in thread and "merged &lt;i&gt;ok&lt;/i&gt;" in thread
        assert ids(get(srv, "/messages?priority=high")[2]) == [asked]
        assert ids(get(srv, "/messages?priority=urgent")[2]) == [urgent]
        normal = ids(get(srv, "/messages?priority=normal")[2])
        assert plain in normal and asked not in normal and urgent not in normal
        assert get(srv, "/messages?priority=soon")[0] == 400
        metrics = get(srv, "/metrics")[2]
    assert re.search(r"(?m)^relay_acks_overdue 1\.0$", metrics)


def test_the_live_stream_carries_hostile_text_inertly(team):
    """What agents wrote reaches the server-sent events as JSON strings on one data line each,
    every control and bidi character shown as an escape (the page sets them as text)."""
    import json
    import urllib.request
    with server(team.root) as srv:
        after = re.search(r'data-after="(\d+)"', get(srv, "/messages")[2]).group(1)
        req = urllib.request.Request(f"{srv.base}/events?after={after}",
                                     headers={"Authorization": f"Bearer {srv.token}"})
        with urllib.request.urlopen(req, timeout=20) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            for i, bad in enumerate(HOSTILE):
                team("send", "--from", "Alice", "--to", "Bob", "--subject", bad, "--thread", f"t{i}{bad}", bad)
            team("send", "--from", "Alice", "--to", "Bob", "--create", "--thread", "x", "--subject", "s", "y")
            (team.state / "outbox" / "Alice" / "odd").write_text(
                "TO: <script>alert(1)</script>\u202e\x1b[31m\nSUBJECT: \u2066x\x07\n\nbody")
            team("run", "--once")
            docs, raw = [], b""
            while not any(e["event"] == "failed" for d in docs for e in d["events"]):
                line = stream.readline()
                assert line, "the stream ended"
                raw += line
                if line.startswith(b"data: "):
                    docs.append(json.loads(line[6:]))
    text = raw.decode("utf-8")
    assert not [c for c in text if (c < " " and c != "\n") or "\x7f" <= c <= "\x9f"
                or "\u202a" <= c <= "\u202e" or "\u2066" <= c <= "\u2069"]
    failed = next(e for d in docs for e in d["events"] if e["event"] == "failed")
    assert "<script>alert(1)</script>" in failed["detail"] and "\\u202e" in failed["detail"]
    assert all(set(d) >= {"seq", "counts", "headline", "events"} for d in docs)


def test_every_string_of_a_live_document_is_made_inert_however_deep():
    """The stream's document is cleaned whole (an event's detail is written by many hands):
    strings in dicts, in lists of dicts, and in lists of lists."""
    from relay.web.live import clean
    bad = "\x1b[31m\u202e<b>\x07"
    doc = clean({"headline": bad, "events": [{"detail": bad, "to": [bad, [bad]]}], "n": 3, "none": None})
    flat = json.dumps(doc, ensure_ascii=False)
    assert not any(c in flat for c in "\x1b\u202e\x07") and doc["n"] == 3 and doc["none"] is None
    assert doc["events"][0]["to"][1][0] == doc["headline"] == doc["events"][0]["detail"]


def test_the_cli_prints_the_address_with_its_token_once_and_it_signs_in(team):
    """`relay web` as a process: its first line on stdout is the address with the run's token;
    that address signs in (a cookie, then the page), and the token is printed nowhere else. It
    serves at a CPU priority 10 below the one it was started with."""
    import os
    import signal
    import subprocess
    import urllib.parse
    proc = subprocess.Popen([sys.executable, "-m", "relay", "--root", str(team.root), "web"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        first = proc.stdout.readline().decode()
        m = re.fullmatch(r"relay web: (http://127\.0\.0\.1:(\d+))/\?token=([A-Za-z0-9_-]{32,})\n", first)
        assert m, first
        base, port, token = m.group(1), m.group(2), m.group(3)

        class Srv:
            pass
        srv = Srv()
        srv.base = base
        status, headers, _ = get(srv, "/?" + urllib.parse.urlencode({"token": token}), token=None)
        assert status == 303 and headers["location"] == "/"
        cookie = headers["set-cookie"].split(";")[0]
        assert cookie == f"relay_web_{port}={token}"
        status, _, page = get(srv, "/", token=None, headers={"Cookie": cookie})
        assert status == 200 and "Overview" in page
        # below the daemon's CPU priority: a web view under load slows itself, not delivery
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert (first.encode() + out + err).decode().count(token) == 1


@pytest.mark.soak
def test_web_load_short_soak(tmp_path):
    """A short run of benchmarks/web_load.py: live streams held open and pages hammered (huge
    query strings, path traversal, no token and wrong ones) while the daemon delivers: no harm,
    every message delivered in every phase, every stream served to the end."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("web_load",
                                                  Path(__file__).parent.parent / "benchmarks" / "web_load.py")
    web_load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(web_load)
    out = web_load.run(tmp_path, clients=100, seconds=2.0, rate=20.0, workers=4, rows=500, limit=300.0)
    assert out["harm"] == {}, out
    for name in ("quiet", "hammered", "quiet_again"):
        assert out[name]["delivered"] == out[name]["offered"] == 40, out
    assert out["streams"]["opened"] == out["streams"]["open_at_end"] == 100, out
    assert out["streams"]["updates"] > 0
    assert {"page", "traversal", "huge_query", "no_token", "wrong_token"} <= set(out["requests"]), out


def test_the_overviews_hours_are_the_last_48_the_current_one_included(project):
    """Messages per hour on the Overview: from the start of the hour 47 hours before this one,
    each hour counted by when relay found its messages; an hour older is left out."""
    from relay.ids import IdGenerator
    from relay.web import reads
    relay = project.relay()
    now = 1_760_000_000.0 + 1800                # half past an hour
    this = int(now // 3600)
    ids, rows = IdGenerator(), []
    for hour, n in ((this - 48, 5), (this - 47, 2), (this - 1, 1), (this, 3)):
        for i in range(n):
            at = hour * 3600 + 60 * i
            rows.append((ids.new(at), "Ann", f"m{hour}-{i}", '["Ben"]', "message", "s", "b", 1, "0" * 64, at,
                         f"archive/x/m{hour}-{i}"))
    relay.ledger.operations.add_archived(rows)
    doc = reads.overview(relay.history, relay.layout, relay.config, now)
    assert doc["hours"] == [(this - 47, 2), (this - 1, 1), (this, 3)] and doc["top_hour"] == 3


def test_a_message_is_found_by_its_id_in_either_case_and_an_unknown_id_is_404(team):
    """The message page and its original look an id up upper-cased; an id the ledger does not
    hold, or one that is no id, is a 404 that names it (the page and the download alike)."""
    mid = team("send", "--from", "Alice", "--to", "Bob", "--subject", "found", "hello").stdout.split()[0]
    team("run", "--once")
    unknown = "0" * 26
    with server(team.root) as srv:
        status, _, text = get(srv, f"/messages/{mid.lower()}")
        assert status == 200 and f'<h1>Message <code id="mid">{mid}</code></h1>' in text
        status, headers, data = get(srv, f"/messages/{mid.lower()}/original")
        assert status == 200 and headers["content-disposition"] == f'attachment; filename="{mid}.msg"'
        assert data.endswith("hello")
        for bad in (unknown, mid[:-1], "x" * 26):
            status, _, text = get(srv, f"/messages/{bad}")
            assert status == 404, bad
            assert refused_text(text) == \
                f"no message {bad!r} in the ledger"
            status, _, text = get(srv, f"/messages/{bad}/original")
            assert (status, text) == (404, f"relay web: no message {bad.upper()!r} in the ledger\n")


def test_a_quarantined_original_is_served_and_checked_and_a_missing_one_is_said(team):
    """A failed message's original is its file under failed/: the page checks it against the
    hash and the download serves it; once the file is gone, the page says it is missing (no
    verdict on the hash) and the download is a 404 saying why. An archived original alike."""
    box = team.state / "outbox" / "Alice"
    box.mkdir(parents=True, exist_ok=True)
    (box / "odd").write_text("TO: Nobody\n\nto no one")
    sent = team("send", "--from", "Alice", "--to", "Bob", "hello").stdout.split()[0]
    team("run", "--once")
    quarantined = next((team.state / "failed" / "Alice").glob("*--odd"))
    failed = quarantined.name.split("--")[0]
    archived = next((team.state / "archive").rglob(f"{sent}--*"))
    with server(team.root) as srv:
        text = get(srv, f"/messages/{failed}")[2]
        assert f'<p id="hash" class="ok"><code>failed/Alice/{failed}--odd</code>: its bytes hash to the ' \
               "recorded sha256</p>" in text
        assert 'id="download"' in text
        status, _, data = get(srv, f"/messages/{failed}/original")
        assert (status, data) == (200, "TO: Nobody\n\nto no one")
        quarantined.unlink()
        archived.unlink()
        for mid, rel in ((failed, f"failed/Alice/{failed}--odd"), (sent, str(archived.relative_to(team.state)))):
            text = get(srv, f"/messages/{mid}")[2]
            assert f'<p id="hash" class="quiet"><code>{rel}</code>: its file is missing</p>' in text
            status, _, data = get(srv, f"/messages/{mid}/original")
            assert (status, data) == (404, f"relay web: the original of {mid} cannot be read: "
                                           "No such file or directory\n")


def test_an_original_of_exactly_the_most_the_web_reads_is_checked_and_one_byte_more_is_refused(team, monkeypatch):
    """MAX_ORIGINAL bytes are read and hashed; one byte more is not read: the page and the
    download both say it is larger than the limit (in MiB) and where to read it instead."""
    from relay.web import reads
    monkeypatch.setattr(reads, "MAX_ORIGINAL", 1 << 20)
    mid = team("send", "--from", "Alice", "--to", "Bob", "x").stdout.split()[0]
    team("run", "--once")
    archived = next((team.state / "archive").rglob(f"{mid}--*"))
    kept = archived.read_bytes()
    archived.write_bytes(kept + b"y" * ((1 << 20) - len(kept)))
    with server(team.root) as srv:
        text = get(srv, f"/messages/{mid}")[2]
        assert 'id="hash" class="err"' in text and "do NOT hash to the recorded sha256" in text
        status, _, data = get(srv, f"/messages/{mid}/original")
        assert status == 200 and len(data) == 1 << 20
        with archived.open("ab") as f:
            f.write(b"y")
        text = get(srv, f"/messages/{mid}")[2]
        assert 'id="hash" class="quiet"' in text
        assert "its file cannot be read: larger than 1 MiB: not shown here (relay show has it)" in text
        status, _, data = get(srv, f"/messages/{mid}/original")
        assert (status, data) == (404, f"relay web: the original of {mid} cannot be read: larger than 1 MiB: "
                                       "not shown here (relay show has it)\n")


def test_the_original_kept_is_the_archive_file_when_archived_and_the_quarantined_one_otherwise():
    """stored_original: an archived message's archive_path, any other's failed_path; none for a
    path that is no text or empty; a path outside archive/ or failed/ refused as unsafe."""
    from relay.errors import NotFound
    from relay.web import reads
    row = {"id": "X", "archive_path": "archive/d/a", "failed_path": "failed/A/f"}
    assert reads.stored_original({**row, "status": "archived"}) == "archive/d/a"
    assert reads.stored_original({**row, "status": "failed"}) == "failed/A/f"
    assert reads.stored_original({**row, "status": "expired"}) == "failed/A/f"
    for empty in (None, "", 7):
        assert reads.stored_original({**row, "status": "failed", "failed_path": empty}) is None
        assert reads.stored_original({**row, "status": "archived", "archive_path": empty}) is None
    assert reads.stored_original({**row, "status": "archived", "archive_path": "failed/A/f"}) == "failed/A/f"
    for outside in ("inbox/Bob/new/x", "archive", "../archive/x", "/etc/passwd", "archive/../x"):
        with pytest.raises(OSError):
            reads.stored_original({**row, "status": "archived", "archive_path": outside})
    with pytest.raises(NotFound, match=r"^message X has no original kept \(status pending\)$"):
        reads.read_original(None, {**row, "status": "pending", "failed_path": None})


def test_an_original_whose_recorded_path_leaves_archive_and_failed_is_neither_read_nor_served(team):
    """A record edited to point its original elsewhere (an inbox): the page says the path cannot
    be followed and why, with no verdict on the hash and no download link; the download is a 404."""
    import sqlite3
    mid = team("send", "--from", "Alice", "--to", "Bob", "hi").stdout.split()[0]
    team("run", "--once")
    with sqlite3.connect(team.state / "ledger.sqlite") as db:
        db.execute("UPDATE messages SET archive_path = 'inbox/Bob/x' WHERE id = ?", (mid,))
    db.close()
    with server(team.root) as srv:
        text = get(srv, f"/messages/{mid}")[2]
        assert ('<p id="hash" class="quiet">its recorded path cannot be followed: &#39;inbox/Bob/x&#39; is not a '
                "path under archive or failed/</p>") in text
        assert 'id="download"' not in text
        status, _, data = get(srv, f"/messages/{mid}/original")
        assert (status, data) == (404, f"relay web: the original of {mid} cannot be read: 'inbox/Bob/x' is not a "
                                       "path under archive or failed/\n")


@pytest.mark.parametrize("text, seq", [("0", 0), ("42", 42), ("9" * 18, 10**18 - 1), ("9" * 19, None), ("", None),
                                       ("-1", None), ("+1", None), (" 1", None), ("1.0", None), ("\u0661", None),
                                       (None, None)])
def test_a_streams_after_is_a_seq_of_ascii_digits_of_at_most_18(text, seq):
    from relay.web.live import seq_of
    assert seq_of(text) == seq


def test_the_live_hub_sends_only_news_at_most_a_batch_at_a_time_and_catches_a_late_page_up(project, monkeypatch):
    """The hub's first look only notes where the log stands; each later look sends the events
    after the last one it sent, at most BATCH of them (the rest at the next look), with the
    counts; a page drawn before the hub's last look gets the events between, and none past it."""
    from relay.web import live
    relay = project.relay()
    monkeypatch.setattr(live, "BATCH", 3)
    hub = live.Hub(lambda: relay.history)
    project.drop("Ann", "a0", "TO: Ben\n\nfirst")
    relay.drain()
    start = relay.history.last_event()
    assert hub._news() is None and hub.seq == start
    assert hub._news() is None and hub.seq == start          # nothing new: nothing sent
    for i in range(2):
        project.drop("Ann", f"b{i}", f"TO: Ben\n\nmore {i}")
    relay.drain()
    after = [e["seq"] for e in relay.history.events_after(start)]
    assert len(after) > 3
    got = []
    while (doc := hub._news()) is not None:
        assert 1 <= len(doc["events"]) <= 3 and doc["seq"] == doc["events"][-1]["seq"] == hub.seq
        assert doc["counts"] == relay.history.counts() and doc["headline"]
        got += [e["seq"] for e in doc["events"]]
    assert got == after and hub.seq == relay.history.last_event()
    caught = hub._since(start, after[1])
    assert [e["seq"] for e in caught["events"]] == after[:2] and caught["seq"] == after[1]
    assert hub._since(after[-1], after[-1]) is None


def test_the_agents_page_lists_each_agents_leases_held_until_the_moment_they_end(crew):
    """A lease is shown on its agent's row, exclusive or shared, with its end, while the page's
    clock is before that end; at the end itself it is no longer held, and no row shows it."""
    from relay.core.message import iso
    alice, bob = crew.agent("Alice"), crew.agent("Bob")
    alice.reserve(["src/"], ttl="1h", exclusive=True, reason="refactor")
    bob.reserve(["docs/guide.md"], ttl="30m")
    start = crew.clock.now

    def rows(at):
        with server(crew.root, clock=lambda: at) as srv:
            text = get(srv, "/agents")[2]
        return dict(re.findall(r'<tr data-agent="(\w+)">(.*?)</tr>', text, re.S))
    got = rows(start + 1799)
    assert f"<div><code>src</code> (exclusive) until {iso(start + 3600)}</div>" in got["Alice"]
    assert f"<div><code>docs/guide.md</code> until {iso(start + 1800)}</div>" in got["Bob"]
    assert "<code>" not in got["Carol"]
    got = rows(start + 1800)
    assert "<code>src</code>" in got["Alice"] and "<code>" not in got["Bob"]
    got = rows(start + 3600)
    assert "<code>" not in got["Alice"] and "<code>" not in got["Bob"]


def test_compose_without_a_recipient_or_to_an_unknown_one_refuses_in_words_and_keeps_the_form(team):
    """No recipient ticked: 400 asking for one; a recipient relay refuses: 400 with relay's own
    reason; either way the subject and body typed stay in the form and nothing is sent."""
    from urllib.parse import urlencode
    team("init", "--agent", "Human")
    with server(team.root, compose="Human") as srv:
        token = _csrf(get(srv, "/compose")[2])
        kinds = {"Content-Type": "application/x-www-form-urlencoded", "Origin": srv.base}
        form = urlencode({"subject": "kept subject", "body": "kept body", "csrf": token}).encode()
        status, _, text = get(srv, "/compose", data=form, headers=kinds)
        assert status == 400 and '<p class="refused" id="refused">choose at least one recipient</p>' in text
        assert 'value="kept subject"' in text and "kept body</textarea>" in text and 'id="sent"' not in text
        form = urlencode({"to": "Nobody", "subject": "kept subject", "body": "kept body", "csrf": token}).encode()
        status, _, text = get(srv, "/compose", data=form, headers=kinds)
        assert status == 400 and ('<p class="refused" id="refused">unknown recipient &#39;Nobody&#39;; known agents: '
                                  "Alice, Bob, Carol, Human") in text
        assert "kept body</textarea>" in text and 'id="sent"' not in text
    team("run", "--once")
    assert not list((team.state / "inbox").glob("*/new/*.json"))


def test_the_pages_own_files_are_served_by_name_with_their_type_and_any_other_name_is_404(web):
    status, headers, text = get(web, "/static/relay.js")
    assert status == 200 and headers["content-type"] == "text/javascript; charset=utf-8"
    assert headers["cache-control"] == "max-age=3600" and text
    status, headers, _ = get(web, "/static/relay.css")
    assert status == 200 and headers["content-type"] == "text/css; charset=utf-8"
    for name in ("nope.js", "relay.JS", "__init__.py", "relay.js.map"):
        status, _, text = get(web, f"/static/{name}")
        assert (status, text) == (404, "relay web: no such file\n"), name
    assert get(web, "/static/..%2Frelay.js")[0] == 404
    assert get(web, "/static/relay.js", token=None)[0] == 401


def test_messages_filters_by_status_kind_and_thread_each_narrowing_to_exactly_its_own(team):
    box = team.state / "outbox" / "Alice"
    box.mkdir(parents=True, exist_ok=True)
    (box / "lost").write_text("TO: Nobody\n\nto no one")
    a = team("send", "--from", "Alice", "--to", "Bob", "--thread", "t1", "one").stdout.split()[0]
    b = team("send", "--from", "Bob", "--to", "Carol", "--thread", "t2", "two").stdout.split()[0]
    team("run", "--once")
    team("run", "--once")
    with server(team.root) as srv:
        every = set(ids(get(srv, "/messages")[2]))
        [failed] = ids(get(srv, "/messages?status=failed")[2])
        [bounce] = ids(get(srv, "/messages?kind=bounce")[2])
        assert every == {a, b, failed, bounce}
        assert set(ids(get(srv, "/messages?status=archived")[2])) == {a, b, bounce}
        assert set(ids(get(srv, "/messages?kind=message")[2])) == {a, b, failed}
        assert ids(get(srv, "/messages?thread=t1")[2]) == [a]
        assert ids(get(srv, "/messages?thread=t2&status=archived")[2]) == [b]
        assert ids(get(srv, "/messages?thread=t2&status=failed")[2]) == []
        assert ids(get(srv, "/messages?status=pending")[2]) == []
        assert set(ids(get(srv, "/messages?status=+archived+&kind=message")[2])) == {a, b}   # spaces trimmed


def _stream(srv, after=None):
    import urllib.request
    req = urllib.request.Request(f"{srv.base}/events" + (f"?after={after}" if after is not None else ""),
                                 headers={"Authorization": f"Bearer {srv.token}"})
    return urllib.request.urlopen(req, timeout=20)


def _next_update(stream):
    while True:
        line = stream.readline()
        assert line, "the stream ended"
        if line.startswith(b"data: "):
            return json.loads(line[6:])


def test_a_page_drawn_before_the_hubs_last_look_is_caught_up_first_and_past_the_most_streams_one_is_refused(
        team, monkeypatch):
    """A live page opened with an `after` older than what the hub has sent gets the events
    between at once, then what follows, and the pages open before get nothing again; with
    MAX_CLIENTS streams open, one more is a 503."""
    from relay.web import live
    monkeypatch.setattr(live, "MAX_CLIENTS", 3)
    team("send", "--from", "Alice", "--to", "Bob", "first")
    team("run", "--once")
    with server(team.root) as srv:
        drawn = int(re.search(r'data-after="(\d+)"', get(srv, "/messages")[2]).group(1))
        with _stream(srv, drawn) as one:
            mid = team("send", "--from", "Alice", "--to", "Bob", "second").stdout.split()[0]
            team("run", "--once")
            got = []
            while not any(e["event"] == "archived" and e["id"] == mid for e in got):
                got += _next_update(one)["events"]
            with _stream(srv, drawn) as late:
                caught = _next_update(late)
                assert {e["seq"] for e in got} <= {e["seq"] for e in caught["events"]}      # all the hub sent
                assert caught["events"][0]["seq"] == drawn + 1 and any(e["id"] == mid for e in caught["events"])
                with _stream(srv) as plain:                     # a page with no `after` joins as it is
                    assert plain.readline() == b"retry: 2000\n"
                    status, _, text = get(srv, f"/events?after={drawn}")
                    assert (status, text) == (503, "relay web: 3 live pages are open; try again later\n")
                # the late page moved nothing back: the first one gets what follows, nothing twice
                third = team("send", "--from", "Alice", "--to", "Bob", "third").stdout.split()[0]
                team("run", "--once")
                while not any(e["event"] == "archived" and e["id"] == third for e in got):
                    got += _next_update(one)["events"]
                seqs = [e["seq"] for e in got]
                assert len(seqs) == len(set(seqs)) and seqs == sorted(seqs)


def test_an_acknowledgement_is_overdue_from_exactly_ack_overdue_after_delivery_on_the_message_page_and_overview(team):
    from relay.ledger.history import History
    from relay.ledger.ledger import Ledger
    asked = team("send", "--from", "Alice", "--to", "Bob", "--ack-required", "please").stdout.split()[0]
    team("run", "--once")
    with History(Ledger(team.state / "ledger.sqlite", readonly=True)) as history:
        [delivered] = [d["delivered_at"] for d in history.deliveries(asked)]
    for at, late in ((delivered + 1799.999, False), (delivered + 1800, True)):
        with server(team.root, clock=lambda at=at: at) as srv:
            page = get(srv, f"/messages/{asked}")[2]
            overview = get(srv, "/")[2]
        [bob] = re.findall(r'<tr data-recipient="Bob">(.*?)</tr>', page, re.S)
        assert ("overdue" in bob) is late, at - delivered
        acks = re.search(r'<section id="acks-overdue">(.*?)</section>', overview, re.S).group(1)
        assert (asked in acks) is late, at - delivered


def test_a_row_of_messages_names_a_remote_sender_with_its_node_a_duplicate_as_such_and_its_priority():
    import types

    from relay.web.reads import message_list
    history = types.SimpleNamespace(sheds_of=lambda ids: {"B": {"queue_full": 1, "age": 2}},
                                    receipts=types.SimpleNamespace(priorities=lambda ids: {"B": "urgent"}))

    def row(mid, **k):
        return {"id": mid, "sender": "Ann", "node": None, "recipients": '["Ben", "Cy"]', "kind": "message",
                "thread": None, "subject": "s", "duplicate_of": None, "status": "archived", "discovered_at": 1.0,
                "error": None, **k}
    a, b, c = message_list([row("A"), row("B", node="n2", status="failed", error="e"), row("C", duplicate_of="A")],
                           history)
    assert (a["from"], a["to"], a["status"], a["shed"], a["priority"]) == ("Ann", "Ben, Cy", "archived", [], "normal")
    assert (b["from"], b["status"], b["error"], b["shed"], b["priority"]) == ("Ann@n2", "failed", "e",
                                                                              ["age", "queue_full"], "urgent")
    assert (c["status"], c["from"]) == ("duplicate", "Ann")


def test_an_unknown_thread_is_a_404_naming_it_and_a_known_one_lists_its_messages_oldest_first(team):
    first = team("send", "--from", "Alice", "--to", "Bob", "--thread", "plan", "--subject", "one", "a").stdout.split()[0]
    second = team("send", "--from", "Bob", "--to", "Alice", "--thread", "plan", "--subject", "two", "b").stdout.split()[0]
    team("send", "--from", "Bob", "--to", "Alice", "--thread", "planx", "other")
    team("run", "--once")
    with server(team.root) as srv:
        status, _, text = get(srv, "/threads/pla")
        assert status == 404
        assert refused_text(text) == \
            "no thread 'pla' in the ledger"
        status, _, text = get(srv, "/threads/plan")
        assert status == 200 and ids(text) == [first, second]


def test_the_agents_page_says_each_agent_active_released_or_archived(crew):
    alice = crew.agent("Alice")
    alice.release_agent("Bob", "done for today")
    crew("run", "--once")
    crew("archive-agent", "Carol")
    with server(crew.root) as srv:
        text = get(srv, "/agents")[2]
    rows = dict(re.findall(r'<tr data-agent="(\w+)">(.*?)</tr>', text, re.S))
    states = {name: re.search(r'<span class="state st-(\w+)">(\w+)</span>', row).groups() for name, row in rows.items()}
    assert states["Alice"] == ("active", "active")
    assert states["Bob"] == ("released", "released")
    assert states["Carol"] == ("archived", "archived")


def test_relay_web_outside_an_initialised_project_says_to_init_and_serves_nothing(cli):
    from conftest import error_line
    r = cli("web", ok=False)
    assert r.exit_code == 1 and error_line(r) == (
        f"no ledger at {cli.state / 'ledger.sqlite'}: run `relay init` (or `relay run`) in the project first")
    cli("init", "--agent", "Ann")
    r = cli("web", "--compose", "--as", "../x", ok=False)
    assert r.exit_code == 1 and error_line(r).startswith("invalid agent name '../x' (--as)")


def test_an_older_page_links_back_to_the_newest_with_the_same_filters_and_the_newest_page_does_not(team):
    for i in range(52):
        team("send", "--from", "Alice", "--to", "Bob", "--thread", "t", f"note {i}")
    team("send", "--from", "Bob", "--to", "Carol", "other")
    team("run", "--once")
    with server(team.root) as srv:
        first = get(srv, "/messages?from=Alice&thread=t")[2]
        assert 'id="newest"' not in first and len(ids(first)) == 50
        older = html.unescape(re.search(r'href="([^"]+)" id="older"', first).group(1))
        assert older == f"/messages?from=Alice&thread=t&before={ids(first)[-1]}"
        rest = get(srv, older)[2]
        assert html.unescape(re.search(r'href="([^"]+)" id="newest"', rest).group(1)) == "/messages?from=Alice&thread=t"
        assert len(ids(rest)) == 2 and 'id="older"' not in rest
        status, _, text = get(srv, f"/messages?before={ids(first)[-1].lower()}")
        assert status == 200 and ids(text) == ids(rest)          # the id upper-cased; Bob's is newer
        for bad in ("0" * 25, "0" * 27, "%D9%A0" * 26, "0" * 25 + "-"):      # too short, long, no ASCII, no id
            assert get(srv, f"/messages?before={bad}")[0] == 400, bad


def test_the_overview_of_a_project_with_no_message_yet_renders_and_says_it_is_not_federated(team):
    from relay.web import reads
    with server(team.root) as srv:
        status, _, text = get(srv, "/")
    assert status == 200 and '<p class="quiet" id="federation">This node is not federated.</p>' in text
    from relay import config as config_mod
    from relay.ledger.history import History
    from relay.ledger.ledger import Ledger
    from relay.files.layout import Layout
    cfg = config_mod.load(team.root, ".relay", env={})
    layout = Layout(cfg.root, cfg.state_dir)
    try:
        with History(Ledger(team.state / "ledger.sqlite", readonly=True)) as history:
            doc = reads.overview(history, layout, cfg, 1_800_000_000.0)
    finally:
        layout.close()
    assert doc["hours"] == [] and doc["top_hour"] == 1 and doc["total"] == 0 and doc["federation"] is None


def test_the_cookie_signs_in_among_others_only_under_this_servers_own_name(team):
    with server(team.root) as srv:
        own = f"relay_web_{srv.port}"
        for cookie, status in ((f"theme=dark; {own}={srv.token}; x=y", 200), (f"{own}={srv.token}", 200),
                               (f"relay_web_{srv.port + 1}={srv.token}", 401), (f"{own}x={srv.token}", 401),
                               (f"theme={srv.token}", 401), (f"{own}=", 401), ("", 401)):
            assert get(srv, "/agents", token=None, headers={"Cookie": cookie})[0] == status, cookie


@pytest.mark.parametrize("key", ["agent", "from", "to"])
def test_each_name_filter_refuses_a_name_no_agent_may_have_and_names_the_filter(team, key):
    with server(team.root) as srv:
        status, _, text = get(srv, f"/messages?{key}=..%2Fetc")
        said = refused_text(text)
        assert status == 400 and said.startswith(f"invalid agent name '../etc' ({key}): agent names match ")
        assert get(srv, f"/messages?{key}=Bob")[0] == 200


@pytest.mark.parametrize("key", ["since", "until"])
def test_each_time_filter_refuses_a_time_it_cannot_read_naming_the_filter_and_takes_one_it_can(team, key):
    with server(team.root) as srv:
        status, _, text = get(srv, f"/messages?{key}=sometime")
        said = refused_text(text)
        assert status == 400 and said.startswith(f"{key}: ")
        assert get(srv, f"/messages?{key}=2h")[0] == 200
        assert get(srv, f"/messages?{key}=2026-11-30")[0] == 200


def _without(monkeypatch, missing):
    """As in a process where `missing` cannot be imported: relay.web imported afresh (the
    package's attribute put back afterwards too, so that later tests see the one in sys.modules)."""
    import relay
    import relay.web
    monkeypatch.setattr(relay, "web", sys.modules["relay.web"])
    for name in [m for m in sys.modules if m == "relay.web" or m.startswith("relay.web.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in [m for m in sys.modules if m == missing or m.startswith(missing + ".")] + [missing]:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("package", ["starlette", "uvicorn", "jinja2", "prometheus_client"])
def test_relay_web_without_any_one_package_of_its_extra_says_how_to_install_it(team, monkeypatch, package):
    from conftest import error_line
    _without(monkeypatch, package)
    r = team("web", ok=False)
    assert r.exit_code == 1 and r.stdout == ""
    assert error_line(r) == ("relay web needs the web extra (starlette, uvicorn, jinja2, prometheus-client), which "
                             "is not installed: pip install 'agent-outbox-relay[web]' (from a checkout: pip install "
                             "'.[web]')")


def test_relay_web_missing_a_module_of_its_own_is_not_said_to_be_the_extra(team, monkeypatch):
    _without(monkeypatch, "relay.web.app")
    with pytest.raises(ImportError) as e:
        team("web", ok=False)
    assert e.value.name == "relay.web.app"


def test_relay_web_on_a_port_already_taken_says_it_cannot_listen_there(team):
    import socket
    from conftest import error_line
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        r = team("web", "--port", str(port), ok=False)
    finally:
        taken.close()
    assert r.exit_code == 1 and r.stdout == ""
    assert error_line(r) == f"cannot listen on 127.0.0.1:{port}: Address already in use"


def test_a_page_read_from_another_site_is_answered_and_a_form_sent_without_origin_headers_is_taken(team):
    """Only a request that changes something is held to the same origin: a GET or HEAD a link of
    another site starts is answered. A form sent with neither Origin nor Sec-Fetch-Site (a
    script with the token) is taken; an Origin of another site is refused even when
    Sec-Fetch-Site claims the same origin."""
    from urllib.parse import urlencode
    team("init", "--agent", "Human")
    with server(team.root, compose="Human") as srv:
        cross = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
        for method in ("GET", "HEAD"):
            assert get(srv, "/messages", headers=cross, method=method)[0] == 200, method
        kinds = {"Content-Type": "application/x-www-form-urlencoded"}
        token = _csrf(get(srv, "/compose")[2])
        form = urlencode({"to": "Bob", "body": "from a script", "csrf": token}).encode()
        assert get(srv, "/compose", data=form, headers=kinds)[0] == 200
        form = urlencode({"to": "Bob", "body": "forged", "csrf": token}).encode()
        said = {**kinds, "Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"}
        status, _, text = get(srv, "/compose", data=form, headers=said)
        assert (status, text) == (403, "relay web: a form is sent from relay web's own pages only\n")
        status, _, _ = get(srv, "/compose", data=form, headers={**kinds, "Origin": srv.base, "Sec-Fetch-Site": "same-site"})
        assert status == 403
    team("run", "--once")
    new = team.state / "inbox" / "Bob" / "new"
    assert [json.loads(p.read_bytes())["body"] for p in new.iterdir()] == ["from a script"]


def test_every_status_shed_included_and_every_priority_is_a_filter_and_the_refusal_lists_them_all(web):
    for status in ("pending", "processing", "delivered", "archived", "failed", "shed"):
        got, _, text = get(web, f"/messages?status={status}")
        assert got == 200 and 'id="refused"' not in text, status
    for priority in ("urgent", "high", "normal", "low"):
        assert get(web, f"/messages?priority={priority}")[0] == 200, priority
    for query, words in (("status=Archived", "no status 'Archived': one of pending, processing, delivered, archived, "
                                             "failed, shed"),
                         ("priority=HIGH", "no priority 'HIGH': one of urgent, high, normal, low")):
        status, _, text = get(web, f"/messages?{query}")
        assert (status, refused_text(text)) == (400, words), query


def test_before_is_a_message_id_of_26_ascii_letters_or_digits_in_either_case(web):
    listing = ids(get(web, "/messages")[2])
    assert len(listing) >= 3
    older = ids(get(web, f"/messages?before={listing[0].lower()}")[2])
    assert older == listing[1:] == ids(get(web, f"/messages?before={listing[0]}")[2])
    for bad in (listing[0][:25], listing[0] + "0", listing[0][:25] + "-", listing[0][:25] + "%C3%A9"):
        status, _, text = get(web, f"/messages?before={bad}")
        assert (status, refused_text(text)) == (400, "before: not a message id"), bad


def test_the_live_hub_says_a_failing_read_once_drops_a_page_that_does_not_read_and_ends_every_stream(project, caplog):
    """A look at the ledger that fails is said once while it fails the same way (each new way
    said again), the next look that works sends the news; a stream whose queue is full is dropped
    (its queue left holding only the end), and closing the hub ends every stream still open."""
    import asyncio
    import logging

    from relay.web import live
    from relay.web.app import Readers
    relay = project.relay()
    project.drop("Ann", "a0", "TO: Ben\n\nfirst")
    relay.drain()
    readers = Readers(project.state / "ledger.sqlite")
    fails = ["busy", "busy", "busy", "gone"]

    def reader():
        if fails:
            raise OSError(fails.pop(0))
        return readers()
    hub = live.Hub(reader, poll=0)
    hub.seq = relay.history.last_event()
    project.drop("Ann", "a1", "TO: Ben\n\nsecond")
    relay.drain()

    async def main():
        slow, fast = asyncio.Queue(1), asyncio.Queue(live.QUEUE)
        slow.put_nowait(b"never read")
        hub.clients |= {slow, fast}
        task = asyncio.get_running_loop().create_task(hub._run())
        data = await asyncio.wait_for(fast.get(), 10)
        dropped = slow not in hub.clients and fast in hub.clients
        hub.loop = asyncio.get_running_loop()
        hub.close()
        await asyncio.wait_for(task, 10)
        return data, dropped, slow, fast
    try:
        with caplog.at_level(logging.WARNING, logger="relay.web.live"):
            data, dropped, slow, fast = asyncio.run(main())
    finally:
        readers.close()
    assert [r.getMessage() for r in caplog.records if r.name == "relay.web.live"] == [
        "relay web: the live view cannot read the ledger: busy", "relay web: the live view cannot read the ledger: gone"]
    head = b"event: update\ndata: "
    assert data.startswith(head) and data.endswith(b"\n\n")
    doc = json.loads(data[len(head):])
    assert doc["seq"] == relay.history.last_event() and doc["events"] and hub.failing is None
    assert dropped and slow.qsize() == 1 and slow.get_nowait() is live.CLOSE
    assert fast.get_nowait() is live.CLOSE and hub.clients == set() and hub.task is None


def answers(port):
    """Whether something accepts a connection on 127.0.0.1:`port`."""
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_the_cli_says_under_its_address_whether_it_is_read_only_or_composes_and_as_whom(team):
    import os
    import signal
    import subprocess
    team("init", "--agent", "Human")
    tail = ("open the address above: the token in it is needed by every page and by /metrics; Ctrl-C stops)\n")
    for args, said in (((), "(read-only; " + tail), (("--compose", "--as", "Human"), "(compose on, sending as Human; "
                                                                                       + tail)):
        # SIGINT at its default, as a terminal's foreground job has it: a runner started in the
        # background by a shell without job control ignores it, and the child would inherit that.
        proc = subprocess.Popen([sys.executable, "-m", "relay", "--root", str(team.root), "web", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            first, second = proc.stdout.readline().decode(), proc.stdout.readline().decode()
            port = int(re.match(r"relay web: http://127\.0\.0\.1:(\d+)/", first).group(1))
            until(lambda: answers(port), f"relay web to answer on port {port}", 20)     # Ctrl-C once it serves
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()             # not left serving after the test
                proc.communicate()
                raise
        assert first.startswith("relay web: http://127.0.0.1:") and second == said, args


def test_the_token_under_another_scheme_of_the_same_length_as_bearer_is_refused(web):
    for scheme, status in (("Digest ", 401), ("Bearer ", 200), ("bEaReR ", 200), ("Bearer\t", 401), ("Beare  ", 401)):
        got = get(web, "/agents", token=None, headers={"Authorization": scheme + web.token})[0]
        assert got == status, scheme


def test_relay_web_takes_a_port_from_0_to_65535_and_refuses_one_outside(team):
    for port in ("-1", "65536"):
        r = team("web", "--port", port, ok=False)
        assert r.exit_code == 2 and "Invalid value for '--port'" in r.stderr and "0<=x<=65535" in r.stderr, port


def test_a_closed_live_hub_refuses_a_new_stream_with_503_and_closes_quietly_before_any_stream(project):
    """A hub closed (the server stopping) before any page opened a stream: close() is quiet, and a
    stream asked for afterwards is refused 503 rather than left open on a hub that sends nothing."""
    import asyncio

    from starlette.requests import Request

    from relay.web import live
    relay = project.relay()
    hub = live.Hub(lambda: relay.history)
    hub.close()
    request = Request({"type": "http", "method": "GET", "path": "/live", "query_string": b"after=0", "headers": []})
    response = asyncio.run(hub.stream(request))
    assert response.status_code == 503
    assert response.body == f"relay web: {live.MAX_CLIENTS} live pages are open; try again later\n".encode()
    assert hub.clients == set() and hub.task is None


def test_compose_with_the_subject_and_thread_left_blank_sends_none_of_either(team):
    """A browser sends the empty subject and thread inputs as blank fields: the message has no
    subject and no thread (not empty ones), and its outbox file no SUBJECT or THREAD line."""
    from urllib.parse import urlencode
    team("init", "--agent", "Human")
    with server(team.root, compose="Human") as srv:
        token = _csrf(get(srv, "/compose")[2])
        form = urlencode({"to": "Bob", "subject": "", "thread": "", "body": "plain", "csrf": token}).encode()
        kinds = {"Content-Type": "application/x-www-form-urlencoded", "Origin": srv.base}
        assert get(srv, "/compose", data=form, headers=kinds)[0] == 200
    [raw] = list((team.state / "outbox" / "Human").iterdir())
    headers = raw.read_text().split("\n\n", 1)[0].splitlines()
    assert [h.split(":")[0] for h in headers] == ["ID", "TO"]
    team("run", "--once")
    [sent] = [json.loads(p.read_bytes()) for p in (team.state / "inbox" / "Bob" / "new").iterdir()]
    assert (sent["subject"], sent["thread"], sent["body"]) == (None, None, "plain")


def test_compose_sends_the_thread_typed_in_the_form(team):
    from urllib.parse import urlencode
    team("init", "--agent", "Human")
    with server(team.root, compose="Human") as srv:
        token = _csrf(get(srv, "/compose")[2])
        form = urlencode({"to": "Bob", "thread": "t7", "body": "in a thread", "csrf": token}).encode()
        kinds = {"Content-Type": "application/x-www-form-urlencoded", "Origin": srv.base}
        assert get(srv, "/compose", data=form, headers=kinds)[0] == 200
    team("run", "--once")
    [sent] = [json.loads(p.read_bytes()) for p in (team.state / "inbox" / "Bob" / "new").iterdir()]
    assert (sent["thread"], sent["subject"], sent["body"]) == ("t7", None, "in a thread")
