"""What a worker role is, as data: the type pdspec/worker/roles.py builds from each role
package's `role.py` (`prefill_worker/role.py`, `decode_worker/role.py`: plain constants, one
per field, in capitals), and what the launcher, the vLLM plugin and the tests read. No vLLM,
no settings."""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import ModuleType


@dataclass(frozen=True)
class RoleSpec:
    name: str
    kv_role: str  # NixlConnector's role: kv_producer or kv_consumer
    port: int  # default HTTP port in `pdspec up`
    side_channel_port: int  # default NIXL side-channel port
    kv_events_port: int  # default port of its KV-event publisher (the replay port is the next one up)
    cpu_core: str  # default VLLM_CPU_OMP_THREADS_BIND on the CPU build
    features: tuple[str, ...]  # engine features the role has (pdspec/worker/engine/features.py)
    # Engine hooks the vLLM plugin installs in every process of the role, in this order, as
    # `module:function` (shared ones in pdspec.worker.engine, the role's own in its package).
    hooks: tuple[str, ...]
    # Hooks installed in the API server's process only (by pdspec.worker.serve), same form:
    # what touches the replies vLLM's server writes.
    server_hooks: tuple[str, ...]
    # The `--scheduler-cls` the role's vLLM runs (the K=0 rule, and what else the role adds).
    scheduler_cls: str

    @classmethod
    def from_module(cls, module: ModuleType) -> RoleSpec:
        """The spec a role module declares; AttributeError names a constant it lacks."""
        return cls(**{field.name: getattr(module, field.name.upper()) for field in fields(cls)})
