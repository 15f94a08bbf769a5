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
