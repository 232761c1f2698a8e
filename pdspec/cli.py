"""`pdspec <command> [options]`: one CLI for the proxy, the workers, the models, `up` and `plan`.

Options are the settings fields of `pdspec.settings`; `pdspec <command> --help` lists
them. A TOML file can hold them too: `pdspec --config file.toml <command>` or
`PDSPEC_CONFIG=file.toml`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from pydantic import ValidationError
from pydantic_settings import CliApp

from pdspec import settings as s

USAGE = """usage: pdspec [--config FILE.toml] <command> [options]

commands:
  up        start a prefill worker, a decode worker and the proxy (1P1D), then wait
  proxy     run the OpenAI-compatible P/D proxy
  prefill   run a prefill worker (vLLM, NIXL kv_producer)
  decode    run a decode worker (vLLM, NIXL kv_consumer)
  models    install the local small model pair (trained target + EAGLE3 drafter)
  drafts    switch a running worker between K=0 when unusable (auto) and always drafting
  bench     start a profile's stack, run a named workload (loadtest.serve_bench), stop it
  plan      size a P/D fleet and K for a workload and an SLO from an engine profile (simulated)

`pdspec <command> --help` lists the command's options.
"""


def _up(cmd: s.UpCommand) -> int:
    from pdspec.supervisor import run_up

    return run_up(cmd)


def _proxy(cmd: s.ProxyCommand) -> int:
    if cmd.proxy.workers > 1:  # a parent and its processes on one port; 1: the one process itself
        from proxy.processes import run_processes

        return run_processes(cmd.proxy)
    from proxy.routing.local_tokenizer import TokenizerLoadError
    from proxy.serve import serve

    try:
        serve(cmd.proxy)
    except TokenizerLoadError as exc:  # a setting that names no tokenizer: said in one line, no traceback
        print(f"pdspec proxy: {exc}", file=sys.stderr)
        return 2
    return 0


def _prefill(cmd: s.PrefillCommand) -> int:
    from prefill_worker.worker import run

    run(cmd)
    return 0


def _decode(cmd: s.DecodeCommand) -> int:
    from decode_worker.worker import run

    run(cmd)
    return 0


def _models(cmd: s.ModelsCommand) -> int:
    import logging

    from pdspec.models.build import install_models

    logging.basicConfig(level="INFO", format="%(message)s")
    out = install_models(cmd.model.models_dir, force=cmd.force)
    print(out)
    return 0


def _drafts(cmd: s.DraftsCommand) -> int:
    from pdspec.worker.engine.control import write_policy
    from pdspec.worker.launch import drafts_file, prometheus_dir
    from pdspec.worker.worker_info import follow_policy

    # Every worker of the role `pdspec up` started (replica i > 0 has its own run dir).
    run_dirs = [cmd.run_dir, *sorted((cmd.run_dir / "replicas").glob(f"{cmd.role}-*"))]
    run_dirs = [run_dir for run_dir in run_dirs if drafts_file(run_dir, cmd.role).parent.is_dir()]
    if not run_dirs:
        print(f"pdspec drafts: no {cmd.role} worker has run in {cmd.run_dir}", file=sys.stderr)
        return 1
    for run_dir in run_dirs:
        write_policy(drafts_file(run_dir, cmd.role), cmd.policy)
        # The worker's pdspec_worker_info follows at once, even while its engine is idle.
        follow_policy(prometheus_dir(run_dir, cmd.role), cmd.policy)
    workers = f"{len(run_dirs)} {cmd.role} workers" if len(run_dirs) > 1 else f"{cmd.role} worker"
    print(f"{workers}: drafts={cmd.policy} from the next engine step")
    return 0


def _plan(cmd: s.PlanCommand) -> int:
    from pdspec.plan.command import run_plan

    return run_plan(cmd)


COMMANDS: dict[str, tuple[type[s._Base], Callable]] = {
    "up": (s.UpCommand, _up),
    "proxy": (s.ProxyCommand, _proxy),
    "prefill": (s.PrefillCommand, _prefill),
    "decode": (s.DecodeCommand, _decode),
    "models": (s.ModelsCommand, _models),
    "drafts": (s.DraftsCommand, _drafts),
    "plan": (s.PlanCommand, _plan),
}


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 2 and args[0] == "--config":
        os.environ[s.CONFIG_ENV] = args[1]
        args = args[2:]
    if args and args[0] == "bench":
        # Its own argument parser: serve_bench's arguments pass through after `--`.
        from loadtest.serving.bench import main as bench_main

        sys.exit(bench_main(args[1:]))
    if not args or args[0] not in COMMANDS:
        print(USAGE, file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout)
        sys.exit(0 if args and args[0] in ("-h", "--help") else 2)
    settings_cls, run = COMMANDS[args[0]]
    try:
        settings = CliApp.run(settings_cls, cli_args=args[1:])
    except ValidationError as exc:
        print(f"pdspec {args[0]}: invalid settings:\n{_describe(exc, args[0])}", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(settings))


def _describe(exc: ValidationError, command: str) -> str:
    lines = []
    for error in exc.errors(include_url=False):
        name = ".".join(str(part) for part in error["loc"])
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            # A setting of another role (a prefill worker's on a decode worker) or of before the
            # groups (`proxy.health_interval_s`, now `proxy.health.interval_s`).
            message = f"no such setting for `pdspec {command}` (docs/configuration.md lists where each one is)"
        lines.append(f"  --{name}: {message} (got {error.get('input')!r})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
