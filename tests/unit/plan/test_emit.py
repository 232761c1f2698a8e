"""Deployments emitted from a plan (pdspec/plan/emit.py) start as written: the TOML is a
config `pdspec up` loads through its own settings (PDSPEC_CONFIG) with the plan's replicas,
K and GPUs; the compose override names docker-compose.yml's services and `docker-compose
config` merges it into settings pdspec accepts; the k8s folder renders with `kubectl
kustomize` into Deployments with the plan's replicas and environment. What a target cannot
express is refused before anything is written. Synthetic profiles (tests/engine_profiles.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest
import yaml

from pdspec import settings as s
from pdspec.plan import emit, routing
from pdspec.plan.fleet_model import Conditional, Layout, Slo
from pdspec.supervisor import replica_settings
from tests import dockerhost
from tests.deploy_wiring import ROOT, settings_problems
from tests.engine_profiles import synthetic
from tests.k8s_render import kustomize

GPU_PROFILE = synthetic(gpu="h200", budget=2048)
CPU_PROFILE = synthetic(gpu="cpu-2core", budget=512, prefill=[(16, 10.0), (512, 40.0)])


def deployment(layout, k=3, profile=GPU_PROFILE, max_num_seqs=128):
    """The plan's deployment with the routing `pdspec plan` names for it when the search chose
    conditional disaggregation for a P:D layout (pdspec/plan/routing.py)."""
    if not layout.is_aggregated:
        layout = dataclasses.replace(layout, conditional=Conditional())
    advice = routing.advise(layout, Slo(ttft_p90_ms=2000, tpot_p90_ms=100))
    settings = advice.settings if advice is not None else None
    return emit.Deployment.of(layout, k, profile, max_num_seqs, f"test plan: {layout}, K={k}", routing=settings)


def load_up_config(monkeypatch, path) -> s.UpCommand:
    """The config as `pdspec --config PATH up` reads it, with no other PDSPEC_* setting around."""
    for name in [name for name in os.environ if name.startswith(s.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv(s.CONFIG_ENV, str(path))
    return s.UpCommand()


def test_the_toml_is_a_pdspec_up_config_with_the_plans_replicas_k_and_gpus(tmp_path, monkeypatch):
    path = emit.write("toml", deployment(Layout.disaggregated(3, 5)), tmp_path / "plan.toml")
    up = load_up_config(monkeypatch, path)
    assert (up.layout, up.prefill.replicas, up.decode.replicas) == ("1p1d", 3, 5)
    assert (up.model.method, up.model.num_speculative_tokens) == ("eagle3", 3)
    assert (up.prefill.max_num_batched_tokens, up.decode.max_num_seqs) == (2048, 128)
    # `pdspec up` gives each replica its own GPU and ports.
    prefills, decodes = replica_settings(up.prefill), replica_settings(up.decode)
    assert [w.cuda_visible_devices for w in prefills + decodes] == [str(gpu) for gpu in range(8)]
    assert len({w.port for w in prefills + decodes}) == 8
    assert f"pdspec --config {path} up" in path.read_text()
    assert up.proxy.observability.plan_replicas == {"prefill": 3, "decode": 5}  # exported for autoscalers
    routing = up.proxy.routing  # the plan chose the split with conditional disaggregation (pdspec/plan/routing.py)
    assert (routing.prefill_policy, routing.decode_policy, routing.disaggregation) == (
        "kv_aware",
        "kv_aware",
        "conditional",
    )
    # Its prefill workers decode too and its decode workers prefill: both roles get both settings.
    assert (up.prefill.max_num_seqs, up.decode.max_num_batched_tokens) == (128, 2048)


def test_a_split_without_the_rule_sets_each_role_its_own_setting_only(tmp_path, monkeypatch):
    plain = emit.Deployment.of(Layout.disaggregated(3, 5), 3, GPU_PROFILE, 64, "t")
    up = load_up_config(monkeypatch, emit.write("toml", plain, tmp_path / "plan.toml"))
    assert (up.prefill.max_num_batched_tokens, up.decode.max_num_seqs) == (2048, 64)
    defaults = (s.PrefillWorkerSettings().max_num_seqs, s.DecodeWorkerSettings().max_num_batched_tokens)
    assert (up.prefill.max_num_seqs, up.decode.max_num_batched_tokens) == defaults
    assert up.proxy.routing.disaggregation == "always"


def test_the_engines_take_the_planned_workloads_longest_request(tmp_path, monkeypatch):
    longest = emit.Deployment.of(Layout.disaggregated(1, 1), 3, synthetic(), 128, "t", longest_request=2176)
    up = load_up_config(monkeypatch, emit.write("toml", longest, tmp_path / "plan.toml"))
    assert up.model.max_model_len == 2176  # ISL 2048 + OSL 128 does not fit the default 2048


def test_k0_runs_without_a_drafter_and_a_cpu_profile_assigns_no_gpus(tmp_path, monkeypatch):
    path = emit.write("toml", deployment(Layout.disaggregated(1, 1), k=0, profile=CPU_PROFILE), tmp_path / "p.toml")
    up = load_up_config(monkeypatch, path)
    assert up.model.method == "none"
    assert up.prefill.cuda_visible_devices is None and up.decode.cuda_visible_devices is None
    assert up.prefill.max_num_batched_tokens == 512


def test_an_aggregated_plan_is_one_colocated_server_per_file_and_says_so(tmp_path, monkeypatch):
    path = emit.write("toml", deployment(Layout.aggregated(4)), tmp_path / "agg.toml")
    up = load_up_config(monkeypatch, path)
    assert (up.layout, up.colocated.max_num_seqs, up.colocated.cuda_visible_devices) == ("colocated", 128, "0")
    assert "run 4 (each on its own GPU and port) behind a load balancer" in path.read_text()
    assert "[proxy" not in path.read_text() and up.proxy.routing == s.RoutingSettings()  # no proxy to route


def test_replicas_pdspec_up_would_refuse_are_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(emit.EmitError, match="settings refuse"):
        emit.write("toml", deployment(Layout.disaggregated(20, 4)), tmp_path / "big.toml")
    assert not (tmp_path / "big.toml").exists()


def compose_config(override) -> dict:
    dockerhost.ensure_tools("docker-compose")
    env = {k: v for k, v in os.environ.items() if not k.startswith(s.ENV_PREFIX)}
    argv = ["docker-compose", "-p", "pdspec", "--profile", "cpu", "--profile", "gpu"]
    argv += ["-f", str(ROOT / "docker-compose.yml"), "-f", str(override), "config"]
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, f"docker-compose config with {override}:\n{out.stderr}"
    return yaml.safe_load(out.stdout)["services"]


def test_the_compose_override_scales_the_cpu_services_with_settings_pdspec_accepts(tmp_path):
    override = emit.write("compose", deployment(Layout.disaggregated(2, 3), profile=CPU_PROFILE), tmp_path / "o.yml")
    named = set(yaml.safe_load(override.read_text())["services"])
    assert (
        named
        == {"prefill", "decode", "proxy"}
        <= set(yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"])
    )
    services = compose_config(override)
    assert (services["prefill"]["scale"], services["decode"]["scale"]) == (2, 3)
    assert services["prefill"]["environment"]["PDSPEC_WORKER__MAX_NUM_BATCHED_TOKENS"] == "512"
    assert services["decode"]["environment"]["PDSPEC_MODEL__NUM_SPECULATIVE_TOKENS"] == "3"
    for name in ("prefill", "decode"):
        assert services[name]["environment"]["PDSPEC_WORKER__HOST"] == "0.0.0.0"  # the file's own, kept
        assert settings_problems(name, services[name]["environment"]) == []
    plan = services["proxy"]["environment"]["PDSPEC_PROXY__OBSERVABILITY__PLAN_REPLICAS"]
    assert json.loads(plan) == {"prefill": 2, "decode": 3}  # exported for autoscalers
    assert services["proxy"]["environment"]["PDSPEC_PROXY__ROUTING__DISAGGREGATION"] == "conditional"
    assert settings_problems("proxy", services["proxy"]["environment"]) == []


def test_the_compose_override_of_a_gpu_plan_uses_the_gpu_services_and_refuses_shared_gpus(tmp_path):
    override = emit.write("compose", deployment(Layout.disaggregated(1, 1)), tmp_path / "gpu.yml")
    services = compose_config(override)
    assert (services["prefill-gpu"]["scale"], services["decode-gpu"]["scale"]) == (1, 1)
    proxy = services["proxy-gpu"]["environment"]
    assert (
        proxy["PDSPEC_PROXY__ROUTING__DISAGGREGATION"],
        proxy["PDSPEC_PROXY__ROUTING__DECODE_FULL_COUNTS_PENDING"],
    ) == (
        "conditional",
        "true",
    )
    assert settings_problems("proxy", proxy) == []
    assert services["decode-gpu"]["environment"]["PDSPEC_WORKER__MAX_NUM_SEQS"] == "128"
    with pytest.raises(emit.EmitError, match="device_ids"):
        emit.write("compose", deployment(Layout.disaggregated(1, 2)), tmp_path / "shared.yml")
    assert not (tmp_path / "shared.yml").exists()


@pytest.mark.parametrize("kind", ["compose", "k8s"])
def test_compose_and_k8s_have_no_colocated_workers(tmp_path, kind):
    with pytest.raises(emit.EmitError, match="no colocated workers"):
        emit.write(kind, deployment(Layout.aggregated(2)), tmp_path / kind)
    assert not (tmp_path / kind).exists()


@pytest.mark.parametrize("profile, overlay", [(GPU_PROFILE, "gpu-1p1d"), (CPU_PROFILE, "cpu")], ids=["gpu-1p1d", "cpu"])
def test_the_k8s_folder_renders_with_the_plans_replicas_and_environment(tmp_path, monkeypatch, profile, overlay):
    monkeypatch.chdir(ROOT)  # the default base is deploy/k8s/overlays/<kind>, from the repository's root
    folder = emit.write("k8s", deployment(Layout.disaggregated(2, 6), profile=profile), tmp_path / "k8s")
    (resource,) = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
    assert resource.startswith("../") and resource.endswith(f"/deploy/k8s/overlays/{overlay}")  # relative
    deployments = {d["metadata"]["name"]: d for d in kustomize(folder) if d["kind"] == "Deployment"}
    assert (deployments["prefill"]["spec"]["replicas"], deployments["decode"]["spec"]["replicas"]) == (2, 6)
    assert deployments["proxy"]["metadata"]["namespace"] == "pdspec"
    # Conditional disaggregation counts the legs of its own process: the patch says so of the base's two.
    assert deployments["proxy"]["spec"]["replicas"] == 2
    assert "its own proxy process only" in (folder / "proxy.yaml").read_text()
    for role, setting, value in (
        ("prefill", "PDSPEC_WORKER__MAX_NUM_BATCHED_TOKENS", str(profile.prefill.max_num_batched_tokens)),
        ("decode", "PDSPEC_WORKER__MAX_NUM_SEQS", "128"),
    ):
        (worker,) = [c for c in deployments[role]["spec"]["template"]["spec"]["containers"] if c["name"] == "worker"]
        env = [(e["name"], e.get("value")) for e in worker["env"]]
        assert env.count((setting, value)) == 1 and [n for n, _ in env].count(setting) == 1  # the overlay's replaced
        assert ("PDSPEC_MODEL__NUM_SPECULATIVE_TOKENS", "3") in env
        assert settings_problems(role, {n: v for n, v in env if v is not None and n.startswith("PDSPEC_")}) == []
    (proxy,) = deployments["proxy"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in proxy["env"] if e["name"].startswith("PDSPEC_")}
    assert json.loads(env["PDSPEC_PROXY__OBSERVABILITY__PLAN_REPLICAS"]) == {"prefill": 2, "decode": 6}
    assert (env["PDSPEC_PROXY__ROUTING__PREFILL_POLICY"], env["PDSPEC_PROXY__ROUTING__DISAGGREGATION"]) == (
        "kv_aware",
        "conditional",
    )
    assert settings_problems("proxy", env) == []


def test_a_k8s_base_without_a_kustomization_is_refused(tmp_path):
    with pytest.raises(emit.EmitError, match="no kustomization.yaml"):
        emit.write("k8s", deployment(Layout.disaggregated(1, 1)), tmp_path / "k8s", k8s_base=tmp_path)
