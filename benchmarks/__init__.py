"""cachedb benchmarks: cachedb against torch's own file caches, measured in the same run.

Run ``python -m benchmarks [--quick] [--only NAME,...] [--out DIR]`` from the repository root.
Sections (``--only`` names): ``warm_start``, ``timings``, ``best_configs``, ``guarded``,
``import``, ``concurrency``, ``disk``. Results go to ``benchmarks/results/latest.json`` and
``latest.md`` (or ``--out``); the Markdown table is printed too.
"""
