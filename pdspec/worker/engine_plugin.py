"""The scheduler class path of earlier pdspec releases, kept so a worker started with
`--scheduler-cls pdspec.worker.engine_plugin.K0Scheduler` (an older profile or manifest)
still runs. The engine hooks live in pdspec/worker/engine/."""

from pdspec.worker.engine.k0_scheduler import K0Scheduler

__all__ = ["K0Scheduler"]
