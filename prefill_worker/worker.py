"""`pdspec prefill`: start vLLM as a prefill worker (its role: role.py)."""

from pdspec.settings import PrefillCommand
from pdspec.worker.launch import exec_worker
from prefill_worker import role


def run(command: PrefillCommand) -> None:
    exec_worker(role.NAME, command.model, command.worker, command.run_dir)
