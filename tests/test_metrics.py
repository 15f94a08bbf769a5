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
