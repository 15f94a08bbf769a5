"""Cost per message stays flat with scale: every statement the relay loop runs uses an index."""
import re


def test_loop_statements_use_indexes(project, clock):
    relay = project.relay()
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
        plan = relay.ledger.explain(sql)
        checked += 1
        full_scans = [step for step in plan if re.match(r"SCAN (messages|events|deliveries|agents)\b", step)]
        assert not full_scans, f"full scan in the loop: {sql}\n{plan}"
    assert checked >= 8
