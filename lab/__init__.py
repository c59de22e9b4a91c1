"""The lab: one-off measurements and profiles behind figures in the docs, kept beside the
product but outside it. Nothing here is installed (pyproject's package list leaves it out) and
nothing installed imports it (tests/test_stack.py); a script runs from the checkout:

    .venv/bin/python -m lab.profile_step A.onnx B.onnx --past 94
    .venv/bin/python lab/quick_latency.py artifacts/onnx artifacts/onnx-int8

A lab script may import anything of tinyt, by its installed name (tinyt.benchmarks.peers, not
benchmarks.peers). What `tinyt bench` runs lives in benchmarks/.
"""
