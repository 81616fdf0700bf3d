"""cachedb benchmarks: cachedb against torch's own file caches, measured in the same run.

Run ``python -m benchmarks [--quick] [--only NAME,...] [--device cuda] [--out DIR]`` from the
repository root. Sections (``--only`` names): ``warm_start``, ``timings``, ``best_configs``,
``guarded``, ``import``, ``concurrency``, ``disk``, ``fleet``, ``startup``, ``pgo``. A full CPU run
writes ``benchmarks/results/cpu.md`` and ``cpu.json``, a ``--device cuda`` run ``gpu.md`` and
``gpu.json`` (or into ``--out``); the Markdown table is printed too. docs/benchmarks.md
describes each section and the method.
"""
