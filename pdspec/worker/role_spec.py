"""What a worker role is, as data: the type the role packages (`prefill_worker/role.py`,
`decode_worker/role.py`) fill in, and what the settings defaults, the launcher, the vLLM
plugin and the engine features read from them. No vLLM, no settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoleSpec:
    name: str
    kv_role: str  # NixlConnector's role: kv_producer or kv_consumer
    port: int  # default HTTP port in `pdspec up`
    side_channel_port: int  # default NIXL side-channel port
    kv_events_port: int  # default port of its KV-event publisher (the replay port is the next one up)
    cpu_core: str  # default VLLM_CPU_OMP_THREADS_BIND on the CPU build
    features: tuple[str, ...]  # engine features the role has (pdspec/worker/engine/features.py)
    # Engine hooks the vLLM plugin installs in every process of the role, by module of
    # pdspec/worker/engine/ (the K=0 rule comes in through --scheduler-cls instead).
    hooks: tuple[str, ...]
