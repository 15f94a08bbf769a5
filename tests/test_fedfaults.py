"""A short run of benchmarks/fedfaults.py: two `relay run` daemons with one ACL user each, traffic
both ways, and faults one after another (the link through a TCP proxy: blackhole, resets,
latency, replies cut; the server: FLUSHALL with a backlog for a stopped node, a restart without
its data, out of memory while a node restarts, a Sentinel failover to a lagging replica). Every
message arrives, exactly once, whatever the fault."""
import importlib.util
import shutil
from pathlib import Path

import pytest

from fednodes import MISSING, REDIS_SERVER

pytestmark = [pytest.mark.soak, pytest.mark.timeout_s(600),
              pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)]

spec = importlib.util.spec_from_file_location("fedfaults", Path(__file__).parent.parent / "benchmarks" / "fedfaults.py")
fedfaults = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fedfaults)


@pytest.fixture(scope="module")
def results():
    # 6 s of each link fault: a blackhole longer than the clients' 5 s socket timeout, so that
    # commands time out and the ones held are executed after the clients gave up on them.
    return fedfaults.run(seconds=6, rate=20, drain=45, echo=lambda *_: None)


@pytest.mark.parametrize("fault", fedfaults.FAULTS)
def test_nothing_lost_or_duplicated_under(fault, results):
    if fault == "failover" and shutil.which("redis-sentinel") is None:
        pytest.skip("redis-sentinel is not installed (Debian's package; .ci/run installs it)")
    r = results[fault]
    assert (r["lost"], r["duplicated"]) == (0, 0), (fault, r, results["_run"])
    assert r["sent"] > 0 and r["max_delay_s"] is not None, r
