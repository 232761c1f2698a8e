"""What only a decode worker runs inside vLLM's processes.

- stale_kv.py: the stale-KV guard (never read a prefill's KV whose lease may have run out)
- scheduler.py: the decode worker's `--scheduler-cls`, the shared K=0 scheduler with the
  guard in front

The cut: a module lives here when no other role runs it; what every worker runs (control
files, counters, features, the K=0 rule, CPU pinning, the short spin, the test hooks) stays
in pdspec/worker/engine/. Imports go one way, from here to pdspec.worker.engine, never back
(tests/unit/test_layout.py checks it); decode_worker/role.py names what pdspec's plugin and
launcher take from here.
"""
