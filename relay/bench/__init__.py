"""`relay bench` (bench.py) and the load generators that it and benchmarks/ share (loadgen.py,
sustained.py). Never imported by the relay itself."""
