"""/metrics: what a Prometheus scraper reads, parsed with prometheus_client's own text parser and
checked against the ledger after a known run (driven with drain() on an injected clock)."""
import pytest
from webkit import get

prometheus = pytest.importorskip("prometheus_client", reason="the web extra is not installed")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from relay.ledger.history import History  # noqa: E402
from relay.ledger.ledger import Ledger  # noqa: E402
from relay.ledger.web import LATENCY_BUCKETS  # noqa: E402
from relay.web.server import Server  # noqa: E402


def samples(text):
    """{(sample name, frozenset of labels): value} of a scrape."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def known_run(project):
    relay = project.relay(agents=("Ann", "Ben", "Cy"))
    for i in range(4):
        project.drop("Ann", f"a{i}", f"TO: Ben\nSUBJECT: s{i}\n\nhello {i}")
    project.drop("Ben", "b", "TO: Ann, Cy\n\nreply")
    project.drop("Cy", "c", "TO: Zed\nSUBJECT: lost\n\nto nobody")     # fails: unknown recipient, bounced
    relay.drain()
    project.clock.advance(5)
    relay.drain()
    return project


def test_metrics_match_the_ledger_after_a_known_run(known_run):
    cfg = known_run.config(agents=["Ann", "Ben", "Cy"])
    with Server(cfg, clock=known_run.clock) as srv:
        status, headers, text = get(srv, "/metrics")
        assert get(srv, "/metrics", token=None)[0] == 401
    assert status == 200 and headers["content-type"].startswith("text/plain")
    got = samples(text)
    with History(Ledger(known_run.state / "ledger.sqlite", readonly=True)) as history:
        counts = history.counts()
        deliveries = [(d, history.get(mid)) for mid in [r["id"] for r in history.audit()]
                      for d in history.deliveries(mid)]
    for state, n in counts.items():
        assert got[("relay_messages", frozenset({("state", state)}))] == n
    assert counts["failed"] == 1 and counts["archived"] == 6       # the 5 delivered and the bounce
    assert got[("relay_deliveries_total", frozenset())] == len(deliveries) == 7
    assert got[("relay_failures_total", frozenset({("reason", "unknown_recipient")}))] == 1
    assert got[("relay_bounces_total", frozenset())] == 1
    assert got[("relay_sheds_total", frozenset({("reason", "queue_limit")}))] == 0
    for agent, unread in (("Ben", 4), ("Ann", 1), ("Cy", 2)):      # Cy: Ben's reply and the bounce
        assert got[("relay_queue_depth", frozenset({("agent", agent)}))] == unread, agent
    # the oldest unread envelope's age, as relay queues says it at the same instant
    from relay.files.layout import Layout
    from relay.operator import queues
    with History(Ledger(known_run.state / "ledger.sqlite", readonly=True)) as history:
        doc = queues.project(history, Layout(known_run.root, known_run.state), ["Ann", "Ben", "Cy"], known_run.clock.now)
    assert {r["agent"] for r in doc["agents"]} >= {"Ann", "Ben", "Cy"}
    for r in (r for r in doc["agents"] if r["agent"] in ("Ann", "Ben", "Cy")):
        assert r["oldest_unread_age_s"] > 0, r
        assert got[("relay_queue_oldest_age_seconds", frozenset({("agent", r["agent"])}))] == pytest.approx(
            r["oldest_unread_age_s"], abs=0.01), r["agent"]
    latencies = [d["delivered_at"] - (m["sent_at"] or m["discovered_at"]) for d, m in deliveries]
    for bound in LATENCY_BUCKETS:
        key = ("relay_envelope_latency_seconds_bucket", frozenset({("le", str(float(bound)))}))
        assert got[key] == sum(1 for x in latencies if x <= bound), bound
    assert got[("relay_envelope_latency_seconds_count", frozenset())] == len(latencies)
    assert got[("relay_envelope_latency_seconds_sum", frozenset())] == pytest.approx(sum(max(x, 0) for x in latencies))
    assert not any(name == "relay_federation_link_up" for name, _ in got)      # not federated


def scrape(url):
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("content-type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type"), e.read().decode()


def test_the_daemon_serves_metrics_alone_where_metrics_listen_says(known_run):
    """[metrics] listen: `relay run` (its service object) serves /metrics on that address without a
    token, read through a ledger connection of its own thread; the figures are the ledger's."""
    from relay.service import Daemon
    (known_run.state / "relay.toml").write_text('agents = ["Ann", "Ben", "Cy"]\n[metrics]\nlisten = "127.0.0.1:0"\n')
    cfg = known_run.config()
    assert (cfg.metrics.host, cfg.metrics.port) == ("127.0.0.1", 0)
    daemon = Daemon(cfg, clock=known_run.clock)
    try:
        daemon.metrics.start()
        known_run.drop("Ann", "late", "TO: Cy\n\none more")
        daemon.relay.drain()
        url = daemon.metrics.url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        status, kind, text = scrape(url)
        assert scrape(url.replace("/metrics", "/"))[0] == 404
        assert scrape(url.replace("/metrics", "/../etc/passwd"))[0] == 404
    finally:
        if daemon.metrics.thread is not None:
            daemon.metrics.stop()
        daemon.relay.close()
    assert status == 200 and kind.startswith("text/plain")
    got = samples(text)
    with History(Ledger(known_run.state / "ledger.sqlite", readonly=True)) as history:
        counts = history.counts()
        delivered = sum(len(history.deliveries(r["id"])) for r in history.audit())
    for state, n in counts.items():
        assert got[("relay_messages", frozenset({("state", state)}))] == n
    assert got[("relay_deliveries_total", frozenset())] == delivered == 8
    assert got[("relay_queue_depth", frozenset({("agent", "Cy")}))] == 3


@pytest.mark.parametrize("listen, words", [("0.0.0.0:9108", None), ("9108", None), ("[::1]:9108", None),
                                            ("metrics.example:9108", "IP address or localhost"),
                                            ("127.0.0.1", "names no port"), ("::1:9108", "in brackets"),
                                            ("127.0.0.1:99999", "names no port")])
def test_metrics_listen_takes_loopback_or_an_address_written_out(tmp_path, listen, words):
    from relay import config as config_mod
    from relay.errors import ConfigError
    (tmp_path / ".relay").mkdir()
    (tmp_path / ".relay" / "relay.toml").write_text(f'[metrics]\nlisten = "{listen}"\n')
    if words is None:
        m = config_mod.load(tmp_path, env={}).metrics
        assert m.port == 9108 and m.host == {"9108": "127.0.0.1", "[::1]:9108": "::1"}.get(listen, "0.0.0.0")
        assert m.loopback == (listen != "0.0.0.0:9108")
        assert config_mod.load(tmp_path, env={"RELAY_METRICS": "127.0.0.1:9200"}).metrics.port == 9200
    else:
        with pytest.raises(ConfigError, match=words):
            config_mod.load(tmp_path, env={})


def test_failures_of_one_kind_whose_reasons_differ_in_their_words_are_counted_together(project):
    relay = project.relay(agents=("Ann", "Ben", "Cy"))
    for name in ("Zed", "Qux", "Zed"):          # "unknown recipient Zed ...", "... Qux ...": one kind
        project.drop("Cy", f"to-{name}-{project.clock.now}", f"TO: {name}\n\nto nobody")
        project.clock.advance(1)
    relay.drain()
    cfg = project.config(agents=["Ann", "Ben", "Cy"])
    with Server(cfg, clock=project.clock) as srv:
        got = samples(get(srv, "/metrics")[2])
    assert got[("relay_failures_total", frozenset({("reason", "unknown_recipient")}))] == 3


@pytest.mark.parametrize("error, kind", [
    ("unknown recipient Zed", "unknown_recipient"), ("UNKNOWN RECIPIENT Zed", "unknown_recipient"),
    ("shed by flow control: queue full", "shed"), ("too large: 2 MiB", "too_large"),
    ("the body is 70000 bytes", "body_size"), ("refused by Ben's rules", "refused"),
    ("the recipient is archived", "recipient_archived"), ("expired by the operator", "expired"),
    ("cannot parse its header", "unreadable"), ("Unreadable file", "unreadable"), ("it is not UTF-8", "unreadable"),
    ("invalid header line", "invalid"), ("unknown sender Mallory", "unknown_sender"),
    ("unknown recipient and too large", "unknown_recipient"), ("too large a body", "too_large"),
    ("the disk is on fire", "other"), ("", "other"), (None, "other")])
def test_a_failures_reason_is_counted_under_the_first_kind_its_words_name_in_any_case(error, kind):
    from relay.web.metrics import failure_kind
    assert failure_kind(error) == kind


def _raw(listener, request):
    import socket
    with socket.create_connection((listener.host, listener.port), timeout=10) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), fields, body


def test_the_metrics_listener_answers_get_and_head_alike_and_a_scrape_before_the_ledger_is_there_fails_alone(
        project):
    """A scrape while the ledger cannot be opened is a 503 naming it, and the next scrape tries
    again; HEAD answers as GET does, with its length and no body; another path is a 404 and
    another method a 405 saying which methods are answered."""
    from relay import config as config_mod
    from relay.web.scrape import Listener
    project.state.mkdir()
    (project.state / "relay.toml").write_text('agents = ["Ann", "Ben"]\n[metrics]\nlisten = "127.0.0.1:0"\n')
    listener = Listener(config_mod.load(project.root, ".relay", env={}), clock=lambda: 1_800_000_000.0).start()
    try:
        status, fields, body = _raw(listener, b"GET /metrics HTTP/1.0\r\n\r\n")
        ledger = project.state / "ledger.sqlite"
        assert status == 503 and body.decode().startswith(f"relay: the ledger could not be read: cannot open the "
                                                          f"ledger {ledger}")
        assert fields["Cache-Control"] == "no-store"
        assert _raw(listener, b"HEAD /metrics HTTP/1.0\r\n\r\n")[::2] == (503, b"")
        relay = project.relay(agents=("Ann", "Ben"))
        project.drop("Ann", "m", "TO: Ben\n\nhello")
        relay.drain()
        status, fields, body = _raw(listener, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n")
        assert status == 200 and b'relay_queue_depth{agent="Ben"} 1.0' in body
        assert fields["Content-Length"] == str(len(body)) and fields["Content-Type"].startswith("text/plain")
        status, head_fields, head_body = _raw(listener, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        assert (status, head_body, head_fields["Content-Length"]) == (200, b"", str(len(body)))
        assert _raw(listener, b"GET /metricsx HTTP/1.0\r\n\r\n")[::2] == (404, b"relay: only /metrics is served here\n")
        assert _raw(listener, b"HEAD / HTTP/1.0\r\n\r\n")[::2] == (404, b"")
        for method in (b"POST", b"DELETE"):
            status, fields, body = _raw(listener, method + b" /metrics HTTP/1.0\r\n\r\n")
            assert (status, fields["Allow"]) == (405, "GET, HEAD")
            assert body.count(b"\n") == 1 and body.startswith(b"relay: ")
    finally:
        listener.stop()


def test_the_metrics_listener_names_an_address_taken_and_warns_when_it_serves_beyond_loopback(tmp_path, caplog):
    import logging

    from relay import config as config_mod
    from relay.errors import ConfigError
    from relay.web.scrape import Listener
    (tmp_path / ".relay").mkdir()
    toml = tmp_path / ".relay" / "relay.toml"
    toml.write_text('[metrics]\nlisten = "127.0.0.1:0"\n')
    first = Listener(config_mod.load(tmp_path, ".relay", env={}))
    try:
        toml.write_text(f'[metrics]\nlisten = "127.0.0.1:{first.port}"\n')
        with pytest.raises(ConfigError, match=rf"^\[metrics\] listen = '127\.0\.0\.1:{first.port}': cannot listen "
                                              r"there: Address already in use$"):
            Listener(config_mod.load(tmp_path, ".relay", env={}))
        assert "without a token" not in caplog.text
    finally:
        first.stop()
    toml.write_text('[metrics]\nlisten = "0.0.0.0:0"\n')
    with caplog.at_level(logging.WARNING, logger="relay.web.scrape"):
        wide = Listener(config_mod.load(tmp_path, ".relay", env={}))
    try:
        assert (f"/metrics is served without a token on http://0.0.0.0:{wide.port}/metrics: whoever reaches that "
                "address reads the figures") in caplog.text
    finally:
        wide.stop()


def test_the_metrics_listener_answers_a_request_it_cannot_read_with_its_code_in_one_line(project):
    """http.server's refusals, said in one line under their own code: a request line of four words
    (400), a request line too long (414, said by its code), a header line too long or too many
    headers (431)."""
    from relay import config as config_mod
    from relay.web.scrape import Listener
    project.state.mkdir()
    (project.state / "relay.toml").write_text('agents = ["Ann"]\n[metrics]\nlisten = "127.0.0.1:0"\n')
    listener = Listener(config_mod.load(project.root, ".relay", env={})).start()
    many = b"".join(b"X-%d: y\r\n" % i for i in range(120))
    try:
        for request, status, words in (
                (b"GET /a b HTTP/1.0\r\n\r\n", 400, b"relay: Bad request syntax ('GET /a b HTTP/1.0')\n"),
                (b"GET /" + b"m" * 70000 + b" HTTP/1.0\r\n\r\n", 414, b"relay: 414\n"),
                (b"GET /metrics HTTP/1.0\r\nX-Long: " + b"y" * 70000 + b"\r\n\r\n", 431, b"relay: Line too long\n"),
                (b"GET /metrics HTTP/1.0\r\n" + many + b"\r\n", 431, b"relay: Too many headers\n")):
            got, fields, body = _raw(listener, request)
            assert (got, body) == (status, words), request[:40]
            assert fields["Content-Length"] == str(len(words)) and "Allow" not in fields
            assert fields["Content-Type"] == "text/plain"
    finally:
        listener.stop()
