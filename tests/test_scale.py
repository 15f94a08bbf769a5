"""Cost per message stays flat with scale: every statement the relay loop runs uses an index."""
import re

TABLES = ("messages", "events", "deliveries", "agents")


def full_scans(relay, sql):
    """The plan's steps that read a whole table, under its name or an alias (`SCAN m`)."""
    scans = []
    for step in relay.history.checks.explain(sql):
        m = re.match(r"SCAN (\w+)", step)
        if m and (m[1] in TABLES or any(re.search(rf"\b{t}\s+(AS\s+)?{m[1]}\b", sql, re.I) for t in TABLES)):
            scans.append(step)
    return scans


def test_loop_statements_use_indexes(project, clock):
    relay = project.relay()
    assert full_scans(relay, "SELECT id FROM messages WHERE body LIKE '%x%'")
    assert full_scans(relay, "SELECT m.id FROM events e JOIN messages m ON m.body = e.detail")
    for i in range(5):
        project.drop("Ann", f"m{i}", "TO: Ben\n\nx")
    project.drop("Ann", "bad", "TO: Nobody\n\nx")
    statements = set()
    relay.ledger.db.set_trace_callback(statements.add)
    relay.drain()
    relay.step(clock.advance(3600))
    relay.sweep(clock.now + 30 * 86400)
    relay.ledger.db.set_trace_callback(None)
    checked = 0
    for sql in statements:
        if not re.match(r"\s*(SELECT|UPDATE|DELETE|INSERT)", sql, re.I) or "sqlite_master" in sql:
            continue
        checked += 1
        assert not full_scans(relay, sql), f"full scan in the loop: {sql}\n{relay.history.checks.explain(sql)}"
    assert checked >= 8
