"""``python -m benchmarks``: sqlqueue_orm beside the raw driver, kombu and PGQueuer, in one run.

Modules by concern: :mod:`benchmarks.servers` (the throwaway PostgreSQL cluster and the SQLite
file), :mod:`benchmarks.workload` (messages, timing, the exactly-once check, results),
:mod:`benchmarks.baselines` (the raw driver running our own rendered statements),
:mod:`benchmarks.peers` (kombu's SQLAlchemy transport, PGQueuer), :mod:`benchmarks.harness`
(the run's sizes and one database's share of it, which every scenario takes),
:mod:`benchmarks.scenarios` (what is measured, ours and the others side by side) and
:mod:`benchmarks.report` (markdown, JSON, PNG). ``benchmarks/bench_hot_path.py`` is a
stand-alone single-file script of the hot path alone.
"""
