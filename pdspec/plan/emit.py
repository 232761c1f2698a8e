"""A plan's layout written as a deployment that starts as written (`pdspec plan --emit`).

- **toml**: a `pdspec up` config (`pdspec --config FILE up`): `[prefill]` and `[decode]`
  replicas, the prefill chunk the profile was measured with (`max_num_batched_tokens`), the
  decode batch the plan assumed (`max_num_seqs`; under conditional disaggregation both on both
  roles, whose workers then also do the other's work), K as `[model] num_speculative_tokens`
  (K=0: `method = "none"`, no drafter), the workload's longest request as `max_model_len`,
  for a GPU profile the GPUs split between the roles (`cuda_visible_devices`: prefill
  0..P-1, decode P..G-1; `pdspec up` gives each replica one), and the proxy's routing the
  plan names (`[proxy.routing]`, `pdspec.plan.routing`: conditional disaggregation where the
  search chose a split with it). An aggregated plan is `layout = "colocated"`: `pdspec up` starts one
  colocated server, so the file is one of the plan's G engines (its header says so).
- **compose**: an override for docker-compose.yml (`-f docker-compose.yml -f FILE`): the
  replica count (`scale`) and the same settings as environment of the prefill and decode
  services: `prefill`/`decode` (the cpu profile) for a CPU profile, `prefill-gpu`/
  `decode-gpu` otherwise; the proxy's routing and plan as the proxy service's environment.
- **k8s**: a folder with a kustomization.yaml over a base (by default the overlay of the
  profile's kind under deploy/k8s, by a relative path) and one patch per Deployment
  (`prefill.yaml`, `decode.yaml`, `proxy.yaml`): replicas and the same settings as container
  environment, the proxy's routing and plan as the proxy's (under conditional disaggregation
  with a comment that each of the base's two proxy replicas decides on its own legs only).

Failure policy: what a target cannot express is refused with `EmitError` before anything
is written: compose and k8s have no colocated workers (an aggregated plan); compose's GPU
services pin one GPU each (`device_ids`), so a second replica would share it; a replica
count or setting pdspec's own settings refuse; a k8s base with no kustomization.yaml.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from pdspec.plan.fleet_model import Layout
from pdspec.plan.profile import EngineProfile
from pdspec.settings import DecodeWorkerSettings, ModelSettings, PrefillWorkerSettings, RoutingSettings

DEFAULT_OUT = {
    "toml": Path("pdspec-plan.toml"),
    "compose": Path("docker-compose.plan.yml"),
    "k8s": Path("pdspec-plan-k8s"),
}
K8S_OVERLAYS = Path("deploy/k8s/overlays")
COMPOSE_SERVICES = {"cpu": ("prefill", "decode"), "gpu": ("prefill-gpu", "decode-gpu")}
COMPOSE_PROXY = {"cpu": "proxy", "gpu": "proxy-gpu"}


class EmitError(ValueError):
    """A layout the chosen target cannot express."""


@dataclass(frozen=True)
class Deployment:
    """What the emitted files set: the plan's layout and K, the engine settings the model assumed."""

    layout: Layout
    k: int
    max_num_batched_tokens: int  # the prefill chunk the profile was measured with
    max_num_seqs: int
    on_gpus: bool  # False for a CPU profile: no GPUs to assign
    title: str  # one line for the files' headers: what plan they come from
    max_model_len: int | None = None  # the workload's longest request (ISL + OSL); None: the model's default
    routing_settings: tuple[tuple[str, object], ...] = ()  # the proxy's routing the plan names; (): its defaults

    @classmethod
    def of(
        cls,
        layout: Layout,
        k: int,
        profile: EngineProfile,
        max_num_seqs: int,
        title: str,
        longest_request: int | None = None,
        routing: dict[str, object] | None = None,
    ) -> Deployment:
        """`longest_request`: the planned workload's largest ISL + OSL, which the engines
        must take (`max_model_len`), or they refuse the requests the plan is for; `routing`:
        the proxy's routing settings the plan names (`pdspec.plan.routing`), None for its defaults."""
        return cls(
            layout,
            k,
            profile.prefill.max_num_batched_tokens,
            max_num_seqs,
            on_gpus(profile),
            title,
            longest_request,
            tuple((routing or {}).items()),
        )

    def model(self) -> dict[str, object]:
        model: dict[str, object] = {"method": "none"} if self.k == 0 else {"num_speculative_tokens": self.k}
        if self.max_model_len is not None:
            model["max_model_len"] = self.max_model_len
        return model

    def prefill(self) -> dict[str, object]:
        # Under conditional disaggregation a prefill worker also decodes the requests it serves
        # whole, and a decode worker prefills: each role gets both settings the model assumed.
        if self.conditional:
            return {"max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs}
        return {"max_num_batched_tokens": self.max_num_batched_tokens}

    def decode(self) -> dict[str, object]:
        if self.conditional:
            return {"max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs}
        return {"max_num_seqs": self.max_num_seqs}

    def routing(self) -> dict[str, object]:
        return dict(self.routing_settings)

    @property
    def conditional(self) -> bool:
        return self.routing().get("disaggregation") == "conditional"

    def proxy_environment(self) -> dict[str, str]:
        """The proxy's PDSPEC_* variables: its routing, and the plan it exports
        (pdspec_plan_replicas) for autoscalers to keep its ratio."""
        variables = {f"PDSPEC_PROXY__ROUTING__{name.upper()}": _env(value) for name, value in self.routing().items()}
        variables["PDSPEC_PROXY__OBSERVABILITY__PLAN_REPLICAS"] = json.dumps(
            {"prefill": self.layout.prefill, "decode": self.layout.decode}
        )
        return variables

    def checked(self) -> Deployment:
        """Itself, once pdspec's settings accept its replica counts and values."""
        try:
            ModelSettings(**self.model())
            RoutingSettings(**self.routing())
            PrefillWorkerSettings(**self.prefill(), replicas=max(1, self.layout.prefill))
            DecodeWorkerSettings(**self.decode(), replicas=max(1, self.layout.decode))
        except ValidationError as exc:
            raise EmitError(f"pdspec's settings refuse {self.layout}, K={self.k}: {exc}") from exc
        return self


def write(kind: str, deployment: Deployment, out: Path | None = None, k8s_base: Path | None = None) -> Path:
    """Write `deployment` as `kind` (toml, compose, k8s) to `out` (or DEFAULT_OUT); the path written."""
    out = Path(out or DEFAULT_OUT[kind])
    deployment.checked()
    if kind == "toml":
        out.write_text(toml(deployment, out))
        return out
    if deployment.layout.is_aggregated:
        raise EmitError(f"{kind} has no colocated workers to run {deployment.layout}: use --emit toml")
    if kind == "compose":
        out.write_text(compose(deployment, out))
        return out
    base = k8s_base or default_k8s_base(deployment.on_gpus)
    files = k8s(deployment, base, out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    return out


def on_gpus(profile: EngineProfile) -> bool:
    """Whether the profile's engines run on GPUs (its `gpu` is not a CPU, e.g. 'cpu-2core')."""
    return not profile.gpu.lower().startswith("cpu")


def default_k8s_base(gpus: bool) -> Path:
    return K8S_OVERLAYS / ("gpu-1p1d" if gpus else "cpu")


def check_k8s_base(base: Path) -> Path:
    if not (Path(base) / "kustomization.yaml").is_file():
        raise EmitError(f"no kustomization.yaml in {base}: run from the repository's root or set --k8s_base")
    return Path(base)


def toml(deployment: Deployment, path: Path) -> str:
    layout = deployment.layout
    lines = [f"# {deployment.title}", f"#   pdspec --config {path} up    (add your [model] target and drafter)"]
    if layout.is_aggregated:
        lines += [
            f"# An aggregated plan of {layout.colocated} engines: `pdspec up` starts one colocated server, so this",
            f"# file is one of them; run {layout.colocated} (each on its own GPU and port) behind a load balancer.",
            'layout = "colocated"',
        ]
    lines += _table("model", deployment.model())
    if layout.is_aggregated:
        gpu = {"cuda_visible_devices": "0"} if deployment.on_gpus else {}
        lines += _table("colocated", {**deployment.prefill(), **deployment.decode(), **gpu})
        return "\n".join(lines) + "\n"
    prefill_gpus, decode_gpus = _gpus(deployment)
    lines += _table("prefill", {"replicas": layout.prefill, **deployment.prefill(), **prefill_gpus})
    lines += _table("decode", {"replicas": layout.decode, **deployment.decode(), **decode_gpus})
    if deployment.routing():
        lines += _table("proxy.routing", deployment.routing())
    # The proxy exports the plan (pdspec_plan_replicas) for autoscalers to keep its ratio.
    lines += [
        "",
        "[proxy.observability]",
        f"plan_replicas = {{ prefill = {layout.prefill}, decode = {layout.decode} }}",
    ]
    return "\n".join(lines) + "\n"


def compose(deployment: Deployment, path: Path) -> str:
    layout = deployment.layout
    profile = "gpu" if deployment.on_gpus else "cpu"
    if deployment.on_gpus and max(layout.prefill, layout.decode) > 1:
        raise EmitError(
            f"docker-compose.yml's gpu services pin one GPU each (device_ids), so {layout} would put replicas "
            "of a role on one GPU: use --emit k8s or --emit toml"
        )
    prefill_service, decode_service = COMPOSE_SERVICES[profile]
    lines = [
        f"# {deployment.title}",
        f"#   docker-compose -p pdspec --profile {profile} -f docker-compose.yml -f {path} up -d",
        "services:",
    ]
    for service, replicas, settings in (
        (prefill_service, layout.prefill, deployment.prefill()),
        (decode_service, layout.decode, deployment.decode()),
    ):
        lines += [f"  {service}:", f"    scale: {replicas}", "    environment:"]
        lines += [f"      {name}: {json.dumps(value)}" for name, value in _environment(deployment, settings).items()]
    lines += [f"  {COMPOSE_PROXY[profile]}:", "    environment:"]
    lines += [f"      {name}: {json.dumps(value)}" for name, value in deployment.proxy_environment().items()]
    return "\n".join(lines) + "\n"


def k8s(deployment: Deployment, base: Path, out: Path) -> dict[str, str]:
    """The files of the kustomization folder `out`, over the kustomization at `base`."""
    resource = os.path.relpath(check_k8s_base(base).resolve(), Path(out).resolve())
    files = {
        "kustomization.yaml": "\n".join(
            [
                f"# {deployment.title}",
                f"#   kubectl apply -k {out}",
                "apiVersion: kustomize.config.k8s.io/v1beta1",
                "kind: Kustomization",
                "resources:",
                f"  - {resource}",
                "patches:",
                "  - path: prefill.yaml",
                "  - path: decode.yaml",
                "  - path: proxy.yaml",
            ]
        )
        + "\n"
    }
    # The proxy's routing, and the plan it exports (pdspec_plan_replicas): the autoscaling
    # components keep its ratio.
    proxy = [
        "# proxy: the plan's routing, and its replicas per role exported as pdspec_plan_replicas{role}",
        *(
            [
                "# Conditional disaggregation decides on the legs of its own proxy process only: with the base's",
                "# two replicas each sees half; the fleet benchmark that chose it ran one.",
            ]
            if deployment.conditional
            else []
        ),
        "apiVersion: apps/v1",
        "kind: Deployment",
        "metadata:",
        "  name: proxy",
        "spec:",
        "  template:",
        "    spec:",
        "      containers:",
        "        - name: proxy",
        "          env:",
    ]
    for name, value in deployment.proxy_environment().items():
        proxy += [f"            - name: {name}", f"              value: {json.dumps(value)}"]
    files["proxy.yaml"] = "\n".join(proxy) + "\n"
    for role, replicas, settings in (
        ("prefill", deployment.layout.prefill, deployment.prefill()),
        ("decode", deployment.layout.decode, deployment.decode()),
    ):
        lines = [
            f"# {role}: {replicas} replicas, the plan's settings (env wins over the ConfigMap's and PDSPEC_CONFIG's)",
            "apiVersion: apps/v1",
            "kind: Deployment",
            "metadata:",
            f"  name: {role}",
            "spec:",
            f"  replicas: {replicas}",
            "  template:",
            "    spec:",
            "      containers:",
            "        - name: worker",
            "          env:",
        ]
        for name, value in _environment(deployment, settings).items():
            lines += [f"            - name: {name}", f"              value: {json.dumps(value)}"]
        files[f"{role}.yaml"] = "\n".join(lines) + "\n"
    return files


def _env(value: object) -> str:
    """A setting's value as an environment variable: booleans as pydantic reads them."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _environment(deployment: Deployment, worker: dict[str, object]) -> dict[str, str]:
    """A worker container's PDSPEC_* variables for the plan (compose and k8s set values as strings)."""
    variables = {f"PDSPEC_MODEL__{name.upper()}": str(value) for name, value in deployment.model().items()}
    variables.update({f"PDSPEC_WORKER__{name.upper()}": str(value) for name, value in worker.items()})
    return variables


def _gpus(deployment: Deployment) -> tuple[dict[str, str], dict[str, str]]:
    if not deployment.on_gpus:
        return {}, {}
    prefill, total = deployment.layout.prefill, deployment.layout.engines
    return (
        {"cuda_visible_devices": ",".join(str(gpu) for gpu in range(prefill))},
        {"cuda_visible_devices": ",".join(str(gpu) for gpu in range(prefill, total))},
    )


def _table(name: str, values: dict[str, object]) -> list[str]:
    # json.dumps writes ints, and strings as TOML basic strings (the values here need no other escapes).
    return ["", f"[{name}]", *(f"{key} = {json.dumps(value)}" for key, value in values.items())]
