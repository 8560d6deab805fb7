"""Conclave's benchmarks. `scripts/bench` (= `python -m bench`) runs the benchmark suite
(what each part measures, and the current figures: docs/performance.md):

- `suite.py`: the run: the panel, the interleaved cells, aggregation, the report, the targets;
- `cell.py`: one (contender, operating point) measurement in a fresh process;
- `contenders.py`: Conclave's Python API, `conclave serve` over stdio and HTTP, raw aiohttp, litellm;
- `common.py`: operating points, the panel's scripts, generated configs, statistics;
- `panel.py`: the simulated panel in its own process, scripted over its control API;
- `profile.py`: py-spy / pyinstrument profile of one cell, with Conclave's hot spots named;
- `providers.py`: the provider-layer figures (also part of the suite's report);
- `instructions.py`, `gc_share.py`, `live_objects.py`: instructions per confer (callgrind), the
  garbage collector's share by load, and objects alive per in-flight call.
"""
