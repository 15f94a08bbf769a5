"""The benchmarks put finished runs aside instead of deleting them between runs (see bench.discard)."""
from relay.bench import bench


def test_a_discarded_run_waits_in_the_trash_until_the_end(tmp_path):
    run = tmp_path / "relay-full-abc"
    (run / ".relay" / "inbox").mkdir(parents=True)
    (run / ".relay" / "inbox" / "m.json").write_text("{}")
    bench.discard(run)
    assert not run.exists()
    kept = tmp_path / bench.TRASH / "relay-full-abc" / ".relay" / "inbox" / "m.json"
    assert kept.read_text() == "{}"        # not deleted: no inode freed during the benchmark
    bench.empty_trash(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_create_probe_measures_and_leaves_only_trash(tmp_path):
    us = bench.create_cost_us(tmp_path, n=50)
    assert us >= 0
    assert [p.name for p in tmp_path.iterdir()] == [bench.TRASH]
    (made,) = (tmp_path / bench.TRASH).iterdir()
    assert len(list(made.iterdir())) == 50
    assert "slow" in bench.create_cost_note(bench.SLOW_CREATE_US + 1)
    assert "slow" not in bench.create_cost_note(bench.SLOW_CREATE_US)


def test_a_trash_name_that_is_a_link_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base = tmp_path / "base"
    base.mkdir()
    (base / bench.TRASH).symlink_to(elsewhere)
    run = base / "relay-full-abc"
    (run / "x").mkdir(parents=True)
    bench.discard(run)
    assert not run.exists() and list(elsewhere.iterdir()) == []     # deleted where it was, not moved away


def test_the_floor_probe_does_each_step_of_a_delivery_and_leaves_only_trash(tmp_path):
    got = bench.floor(tmp_path, n=20, rate=10_000)
    assert 0 < got["p50_ms"] <= got["p99_ms"]
    assert [p.name for p in tmp_path.iterdir()] == [bench.TRASH]
    (made,) = (tmp_path / bench.TRASH).iterdir()
    assert sorted(p.name for p in (made / "new").iterdir()) == sorted(f"{i}.json" for i in range(20))
    assert len(list((made / "archive").iterdir())) == 20 and list((made / "out").iterdir()) == []
    import sqlite3
    db = sqlite3.connect(made / "ledger.sqlite")
    assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 20      # one commit per delivery
    db.close()


def test_the_floor_and_the_daemons_latency_are_taken_in_turns(tmp_path):
    """relay bench's latency: blocks of the floor's deliveries and of messages to the daemon in
    turns, every message seen once (names and tokens go on across blocks), a ratio per block,
    and only the trash left."""
    got = bench.latency(tmp_path, rate=200.0, seconds=0.6, agents=3, floor_blocks=3)
    assert got["messages"] == got["delivered"] == 120
    assert len(got["block_ratios"]) == 3 and all(r > 0 for r in got["block_ratios"])
    assert 0 < got["floor"]["p50_ms"] <= got["floor"]["p99_ms"] and 0 < got["p50_ms"] <= got["p99_ms"]
    assert [p.name for p in tmp_path.iterdir()] == [bench.TRASH]
    floor_dir, project = sorted((tmp_path / bench.TRASH).iterdir(), key=lambda p: p.name)
    assert floor_dir.name.startswith("floor-") and len(list((floor_dir / "new").iterdir())) == 3 * 20
    names = [p.name for d in (project / ".relay" / "archive").rglob("agent*") if d.is_dir() for p in d.iterdir()]
    assert len(names) == 120 and len(set(n.split("--")[-1] for n in names)) == 120
