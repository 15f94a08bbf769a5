"""A short federation soak (benchmarks/fedchaos.py): two nodes, producers on both, either node
killed with SIGKILL again and again and the server twice; each message arrives exactly once."""
import importlib.util
from pathlib import Path

import pytest

from fednodes import MISSING, REDIS_SERVER

pytestmark = [pytest.mark.soak, pytest.mark.timeout_s(300),
              pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)]

spec = importlib.util.spec_from_file_location("fedchaos", Path(__file__).parent.parent / "benchmarks" / "fedchaos.py")
fedchaos = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fedchaos)


def test_short_federation_soak_under_sigkill_of_nodes_and_server():
    result = fedchaos.run(kills=12, server_kills=2, messages=400, seed=5, echo=lambda *_: None)
    assert result["kills"] >= 12 and result["server_kills"] == 2 and result["deliveries"] >= 400
    assert (result["lost"], result["duplicated"], result["unexpected"], result["left"]) == (0, 0, 0, 0), result
