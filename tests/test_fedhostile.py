"""A short run of benchmarks/fedhostile.py: each attack of one hostile node (on its own ACL user)
for a moment, with two honest daemons delivering beside it; each message arrives exactly once
and nothing from SYSTEM is delivered."""
import importlib.util
from pathlib import Path

import pytest

from fednodes import MISSING, REDIS_SERVER

pytestmark = [pytest.mark.soak, pytest.mark.timeout_s(600),
              pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)]

spec = importlib.util.spec_from_file_location("fedhostile", Path(__file__).parent.parent / "benchmarks" / "fedhostile.py")
fedhostile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fedhostile)


def test_each_hostile_attack_briefly_loses_and_duplicates_nothing(tmp_path):
    result = fedhostile.run(seconds=2.0, small=True, echo=lambda *_: None, base=tmp_path)
    assert set(result) == {*fedhostile.ATTACKS, "_"}
    assert result["_"]["sent"] > 0
    assert (result["_"]["lost"], result["_"]["duplicated"], result["_"]["system_delivered"]) == (0, 0, 0), result
    assert result["squat"]["reach"] is not None and result["squat"]["claim"] == "n1", result["squat"]
