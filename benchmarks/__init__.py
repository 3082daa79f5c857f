"""mmpack benchmarks: ratios measured side by side with a floor in the same run.

Run ``python -m benchmarks`` (or ``make bench``; ``--quick`` for the CI smoke run).  Each topic
module exposes ``run(quick: bool) -> list[dict]``; the runner prints one table per topic and
writes the raw figures to ``benchmarks/results/latest.json`` (plots next to it).
"""
