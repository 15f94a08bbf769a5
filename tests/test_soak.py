"""A short randomized soak: the daemon killed with SIGKILL at random instants while producers
write (by rename and in place, reusing `msg`, some to `*`); each message arrives exactly once."""
import importlib.util
from pathlib import Path

import pytest

# chaos.run waits up to 120 s for the relay to settle, then reports what is lost or left over.
pytestmark = [pytest.mark.soak, pytest.mark.timeout_s(180)]

spec = importlib.util.spec_from_file_location("chaos", Path(__file__).parent.parent / "benchmarks" / "chaos.py")
chaos = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chaos)


def test_short_soak_under_sigkill():
    result = chaos.run(cycles=8, messages=200, seed=7, echo=lambda *_: None)
    assert result["kills"] >= 8 and result["deliveries"] >= 200     # every message was written
    assert (result["lost"], result["duplicated"], result["unexpected"], result["left"]) == (0, 0, 0, 0), result


@pytest.mark.timeout_s(150)
def test_short_hostile_soak():
    """benchmarks/hostile.py for a few seconds: links at every level, hard links, odd names,
    future times, held-open files and swapped directories while producers send; nothing outside
    the state directory changes and every well-formed message arrives exactly once."""
    import subprocess
    import sys
    script = Path(__file__).parent.parent / "benchmarks" / "hostile.py"
    r = subprocess.run([sys.executable, str(script), "--seconds", "5", "--seed", "3", "--settle", "60"],
                       capture_output=True, text=True, timeout=140)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert '"lost": 0, "duplicated": 0' in r.stdout and "0 differences" in r.stdout
