"""Issue 27, item 7: one misspelt key in relay.toml. The verbs that only look (and an agent's)
warn and carry on with the key left out; `relay config` shows the bad key with its "did you
mean"; the daemon, and the sweep that acts by `retention`, refuse to start on it with the same
hint."""
import json

import pytest


HINT = "did you mean retention?"


@pytest.fixture
def typo(team):
    team("send", "--from", "Alice", "--to", "Bob", "--subject", "s", "hello")
    team("run", "--once")
    (team.state / "relay.toml").write_text('retension = "3d"\n')
    return team


@pytest.mark.parametrize("verb", [
    ["config"], ["status", "--json"], ["audit"], ["agents"], ["queues"], ["verify"], ["doctor", "--quick"],
    ["report", "--html", "-"], ["adopt", "Bob"], ["tail"], ["inbox", "Bob"], ["read", "--agent", "Bob", "X"],
])
def test_a_read_only_verb_warns_and_carries_on(typo, verb):
    r = typo(*verb, ok=False)
    assert "unknown configuration key 'retension'" in r.stderr and HINT in r.stderr, r.output
    if verb[0] == "read":           # (the id is made up: the verb itself ran, and said so)
        assert r.exit_code == 1 and "no message 'X'" in r.stderr
    else:
        assert r.exit_code == 0, r.output


def test_show_warns_and_carries_on(typo):
    r = typo("audit", "--json")
    mid = json.loads(r.stdout)[0]["id"]
    assert HINT in r.stderr         # (a process prints each warning once)
    assert mid in typo("show", mid).stdout


def test_relay_config_shows_the_bad_key_with_its_hint(typo):
    r = typo("config")
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("retension"))
    assert HINT in line and "ignored" in line
    doc = json.loads(typo("config", "--json").stdout)
    assert doc["values"]["retention"]["text"] == "7d"
    assert [p["key"] for p in doc["problems"]] == ["retension"] and HINT in doc["problems"][0]["problem"]


@pytest.mark.parametrize("verb", [["run", "--once"], ["sweep"]])
def test_the_daemon_and_the_sweep_refuse_to_start_with_the_same_hint(typo, verb):
    r = typo(*verb, ok=False)
    assert r.exit_code == 1 and "unknown configuration key 'retension'" in r.stderr and HINT in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
