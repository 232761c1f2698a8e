"""What this vLLM build offers the plugin, feature-detected (never guessed from a version
string alone): whether the scheduler output carries `skip_drafts` with the V2 runner in
use (vLLM 0.33 applies the K=0 rule itself), else the V1 runner's K override. A vLLM the
plugin does not know is refused at start rather than risk changing outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_VLLM = ("0.32.", "0.33.")


class UnsupportedVllmError(RuntimeError):
    pass


@dataclass(frozen=True)
class Capabilities:
    version: str
    native_skip: bool  # vLLM sets SchedulerOutput.skip_drafts itself (0.33 + V2 runner)


def detect_capabilities(vllm_config: Any) -> Capabilities:
    import vllm
    from vllm.v1.core.sched.output import SchedulerOutput

    version = vllm.__version__
    fields = getattr(SchedulerOutput, "__dataclass_fields__", {})
    if not version.startswith(SUPPORTED_VLLM) or "num_spec_tokens_to_schedule" not in fields:
        raise UnsupportedVllmError(
            f"pdspec's engine plugin supports vLLM 0.32 and 0.33; this is vLLM {version}. "
            "Its scheduler internals may differ, so the plugin refuses to run rather than "
            "risk changing outputs. Start the worker without the plugin or upgrade pdspec."
        )
    has_skip_field = "skip_drafts" in fields
    v2_runner = bool(getattr(vllm_config, "use_v2_model_runner", False))
    return Capabilities(version=version, native_skip=has_skip_field and v2_runner)
