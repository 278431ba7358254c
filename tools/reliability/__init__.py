"""Fuzz and chaos harnesses of issue 34 (configs, datasets, checkpoints, kills, rewards).

`tests/test_reliability.py` runs short versions in CI; `python -m tools.reliability` runs
the long one and prints its counts (docs/results/reliability.md).
"""
