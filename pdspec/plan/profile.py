"""Engine profiles: what one engine of a (model shape, GPU, vLLM version, drafter) does,
measured the way pdspec's workers run it, for the fleet planner (`pdspec plan`).

A profile is a small versioned JSON file (`SCHEMA`). It holds three measured curves and
the KV room:
- **prefill** (a prefill worker: K=0 proposals, the KV-only drafter pass): the time of one
  engine step against the prompt tokens batched in it;
- **decode**, for each draft length K measured (K=0: no drafter): the time of one decode
  step against the requests in the batch, and the tokens a request gains per step (1 + its
  accepted drafts, on the prompts the profile was measured with);
- **transfer**: the KV hand-off's time against the prompt's tokens;
- **kv_tokens**: the tokens one engine's KV cache holds;
- **serving_ms** (optional, 0 when absent): a request's time outside the engines (the HTTP
  servers, the proxy, the legs' round trips and the hand-off's notifications), per layout
  kind, measured on an idle stack (`loadtest.engine_bench.serving_overhead`);
- **device_sharing** (optional, alpha 1 when absent): how much engines sharing a device
  slow each other's steps (`DeviceSharing`: the alpha form, the demand form with its
  `"form": "demand"` and `decode_demand`, or the prefill form with `"form": "prefill"` and
  `prefill_alpha`), fitted to, or measured on, a fleet of engines sharing
  one (`loadtest.plan_check --fit-sharing`, `loadtest.plan_fleet_check --fit-sharing`).

Between measured points a curve is interpolated linearly; past its last point it is
extrapolated along its last segment (a step costs more with more tokens, never less), and
below its first point it takes the first point's value. Failure policy: a file that is not
a profile of this schema, or whose curves are empty or not increasing in x, is refused
when it is loaded (`ProfileError`), never half-read.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

SCHEMA = "pdspec.engine-profile/1"
SHIPPED = Path(__file__).with_name("profiles")  # the profiles that ship with pdspec


class ProfileError(ValueError):
    """A file that is not a usable engine profile."""


class Curve(BaseModel):
    """y against x, as measured: points in increasing x."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    points: list[tuple[float, float]] = Field(min_length=1)

    @field_validator("points")
    @classmethod
    def _increasing(cls, points: list[tuple[float, float]]) -> list[tuple[float, float]]:
        xs = [x for x, _ in points]
        if any(b <= a for a, b in zip(xs, xs[1:])):
            raise ValueError(f"x must increase from point to point, got {xs}")
        return points

    def at(self, x: float) -> float:
        """y at `x`: linear between points; past the last one along the last segment (never
        below the last y), or in proportion to x for a curve of one point; below the first,
        the first point's y."""
        x0, y0 = self.points[0]
        if x <= x0:
            return y0
        if len(self.points) == 1:
            return y0 * x / x0
        xs = [px for px, _ in self.points]
        i = min(bisect.bisect_left(xs, x), len(xs) - 1)
        (xa, ya), (xb, yb) = self.points[i - 1], self.points[i]
        y = ya + (yb - ya) * (x - xa) / (xb - xa)
        return max(y, self.points[-1][1]) if x > xs[-1] else y

    def intercept(self) -> float:
        """y at x = 0 along the first segment, never below 0 (0 for a curve of one point:
        in proportion to x): the fixed part of a step's cost."""
        if len(self.points) == 1:
            return 0.0
        (xa, ya), (xb, yb) = self.points[0], self.points[1]
        return max(0.0, ya - (yb - ya) * xa / (xb - xa))


class PrefillProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_batched_tokens: int = Field(gt=0, description="The step's token budget it was measured with.")
    step_ms: Curve = Field(description="One engine step's time (ms) against the prompt tokens batched in it.")


class DecodeProfile(BaseModel):
    """One draft length K."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_ms: Curve = Field(description="One decode step's time (ms) against the requests in the batch.")
    tokens_per_step: float = Field(
        ge=1, description="Tokens a request gains per step: 1 + its accepted drafts (1 with K=0)."
    )


class ServingOverhead(BaseModel):
    """A request's time outside the engines, added to its TTFT by the fleet model: what one
    request through the whole stack on an idle fleet took, less what the model gives the
    same request from the engine curves alone. A constant: it shifts TTFT, and loads no
    engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    disaggregated_ms: float = Field(
        ge=0, description="Through the proxy, a prefill leg, the hand-off and a decode leg."
    )
    aggregated_ms: float = Field(ge=0, description="Through the proxy and one colocated worker's leg.")
    source: str = Field(description="The probe it was taken from, and how.")

    def for_layout(self, aggregated: bool) -> float:
        return self.aggregated_ms if aggregated else self.disaggregated_ms


DEFAULT_SHARING_ALPHA = 1.0  # no term measured: the device's time split between the steps on it


SHARING_PARAMETERS = {"alpha": "alpha", "demand": "decode_demand", "prefill": "prefill_alpha"}  # each form's one
SHARING_FORMS = tuple(SHARING_PARAMETERS)


class DeviceSharing(BaseModel):
    """How engines sharing one device slow each other (the fleet model's device term,
    pdspec/plan/fleet_model.py), in one of two forms (`form`), each one number per device kind
    and engine shape, fitted to measurements, never derived.

    - **alpha** (the default, and every profile without a `form`): while m engines' steps run
      at once on a device, each progresses at 1 / (1 + alpha * (m - 1)) of its speed alone.
      alpha = 1: the device's time is split between them (its throughput the same however many
      share it); alpha < 1: their steps overlap (a GPU whose small eager steps leave it mostly
      idle); alpha > 1: they thrash (CPU engines whose threads fight for one core); 0: no
      effect at all.
    - **demand**: each running prefill step demands the whole device (1) and each running
      decode step `decode_demand` (c) of it; every running step progresses at
      1 / max(1, prefill steps + c * decode steps) of its speed alone. Prefill steps are
      compute-bound (two cannot together run faster than the device runs one), decode steps
      memory- or launch-bound (c < 1: several overlap). c is at most 1, so a step alone on the
      device (a demand of 1 or c) is never slowed.
    - **prefill**: only prefill steps are slowed: while m steps run at once on a device, p of
      them prefill steps, a prefill step progresses at 1 / max(1 + `prefill_alpha` * (m - 1), p)
      of its speed alone (compute-bound prefills cannot together outrun the device), a decode
      step at its full speed. What one H200 showed with two eager engines on it
      (loadtest/results/plan/check-h200-1p1d-r2/): the prefill engine computed at 0.70-0.74 of
      its rate alone beside the decode engine, whose TPOT did not move."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    form: Literal["alpha", "demand", "prefill"] = Field(default="alpha", description="Which form of the term.")
    alpha: float | None = Field(
        default=None, ge=0, description="The alpha form: the slowdown each further step running on the device adds."
    )
    decode_demand: float | None = Field(
        default=None, ge=0, le=1, description="The demand form: the share of the device a decode step demands."
    )
    prefill_alpha: float | None = Field(
        default=None,
        ge=0,
        description="The prefill form: the slowdown each further running step adds to a prefill step.",
    )
    source: str = Field(description="The measurements it was fitted to, and how.")

    @model_validator(mode="after")
    def _its_forms_parameter(self) -> DeviceSharing:
        parameter = SHARING_PARAMETERS[self.form]
        others = [name for name in SHARING_PARAMETERS.values() if name != parameter]
        if getattr(self, parameter) is None or any(getattr(self, name) is not None for name in others):
            raise ValueError(f"the {self.form} form of device sharing takes {parameter}, and only it")
        return self

    @model_serializer(mode="wrap")
    def _without_unset(self, handler) -> dict:
        # An alpha-form term dumps as it did before the demand form: no form, no null.
        dumped = handler(self)
        return {
            key: value
            for key, value in dumped.items()
            if value is not None and not (key == "form" and value == "alpha")
        }

    @property
    def value(self) -> float:
        """The form's one parameter: alpha, decode_demand or prefill_alpha."""
        return getattr(self, SHARING_PARAMETERS[self.form])


class EngineProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: str = Field(alias="schema")
    model_shape: str = Field(description="The target model (its shape, when weights were dummy).")
    drafter: str = Field(description="The drafter and its method, e.g. 'eagle3 (local)'.")
    gpu: str = Field(description="The accelerator, or 'cpu-2core' for this project's CPU machines.")
    vllm_version: str
    measured: str = Field(description="When and with what command the curves were measured.")
    prefill: PrefillProfile
    decode: dict[int, DecodeProfile] = Field(description="By draft length K (0: no drafter).")
    transfer_ms: Curve = Field(description="The KV hand-off's time (ms) against the prompt's tokens.")
    kv_tokens: int = Field(gt=0, description="Tokens one engine's KV cache holds.")
    serving_ms: ServingOverhead | None = Field(
        default=None, description="A request's time outside the engines; none measured: 0."
    )
    device_sharing: DeviceSharing | None = Field(
        default=None, description=f"Engines sharing a device; none fitted: alpha {DEFAULT_SHARING_ALPHA:g}."
    )

    @property
    def sharing(self) -> DeviceSharing:
        """The device term: the profile's, or alpha DEFAULT_SHARING_ALPHA without one."""
        return self.device_sharing or DeviceSharing(alpha=DEFAULT_SHARING_ALPHA, source="the default")

    @field_validator("schema_")
    @classmethod
    def _known_schema(cls, schema: str) -> str:
        if schema != SCHEMA:
            raise ValueError(f"schema {schema!r} is not {SCHEMA!r}")
        return schema

    @field_validator("decode")
    @classmethod
    def _some_k(cls, decode: dict[int, DecodeProfile]) -> dict[int, DecodeProfile]:
        if not decode or min(decode) < 0:
            raise ValueError("decode needs at least one draft length K >= 0")
        return decode

    def anomalies(self, tolerance: float = 0.05) -> list[str]:
        """What a measurement cannot mean, beyond `tolerance` (a share of the larger step):
        a decode step that costs less with more requests in the batch, or less with more
        drafts (K) at the same batch. Noise, or a measuring method off at some points; a
        planner reading such a curve can pick a K for its dips (K=1 over K=0 with no draft
        accepted). Empty for a clean profile."""
        found = []
        for k, decode in sorted(self.decode.items()):
            points = decode.step_ms.points
            for (b0, ms0), (b1, ms1) in zip(points, points[1:]):
                if ms1 < ms0 * (1 - tolerance):
                    found.append(
                        f"K={k}: a step of {b1:g} requests ({ms1:g} ms) costs less than of {b0:g} ({ms0:g} ms)"
                    )
        ks = sorted(self.decode)
        for lower, higher in zip(ks, ks[1:]):
            for batch, ms in self.decode[higher].step_ms.points:
                below = self.decode[lower].step_ms.at(batch)
                if ms < below * (1 - tolerance):
                    found.append(
                        f"K={higher} at {batch:g} requests ({ms:g} ms) costs less than K={lower} ({below:.4g} ms)"
                    )
        return found

    def with_acceptance(self, rate: float) -> EngineProfile:
        """This profile with each K's tokens per step taken from a per-draft acceptance rate
        instead of measured: (1 - rate^(K+1)) / (1 - rate), the expected tokens a step when
        each draft is accepted with probability `rate` given the ones before it were
        (Leviathan et al., 2023). For profiles measured with random weights (every draft
        rejected: 1.0 at every K) and for a user's own drafter and prompts; the step times
        stay measured. ValueError for a rate outside (0, 1)."""
        if not 0 < rate < 1:
            raise ValueError(f"an acceptance rate is in (0, 1), not {rate}")
        decode = {
            k: d.model_copy(update={"tokens_per_step": (1 - rate ** (k + 1)) / (1 - rate)})
            for k, d in self.decode.items()
        }
        return self.model_copy(update={"decode": decode})

    def with_sharing(self, alpha: float, source: str, form: str = "alpha") -> EngineProfile:
        """This profile with its device term replaced (a fit trying values, or a check run with
        an override): `alpha` is the value of `form`'s parameter (alpha, the demand form's
        decode_demand, the prefill form's prefill_alpha). ValueError for a negative value (a
        step that sharing speeds up), a decode demand over 1, or an unknown form."""
        if form not in SHARING_FORMS:
            raise ValueError(f"a device sharing form is one of {SHARING_FORMS}, not {form!r}")
        parameter = SHARING_PARAMETERS[form]
        if alpha < 0:
            raise ValueError(f"a device sharing {parameter.replace('_', ' ')} is >= 0, not {alpha}")
        if form == "demand" and alpha > 1:
            raise ValueError(f"a decode demand is at most 1 (a lone decode step is never slowed), not {alpha}")
        sharing = DeviceSharing(form=form, source=source, **{parameter: alpha})
        return self.model_copy(update={"device_sharing": sharing})

    def dump(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2) + "\n"


def load(path: Path) -> EngineProfile:
    """The profile in `path`; ProfileError, naming the file, for anything else."""
    try:
        return EngineProfile.model_validate_json(Path(path).read_text())
    except (OSError, ValidationError, ValueError) as exc:
        raise ProfileError(f"{path}: not an engine profile of schema {SCHEMA}: {exc}") from exc


def shipped() -> dict[str, Path]:
    """The profiles shipped with pdspec, by file stem."""
    return {path.stem: path for path in sorted(SHIPPED.glob("*.json"))}
