"""`pdspec prefill`: start vLLM as a prefill worker."""

from pdspec.settings import WorkerCommand
from pdspec.worker.launch import exec_worker

ROLE = "prefill"


def run(command: WorkerCommand) -> None:
    exec_worker(ROLE, command.model, command.worker, command.run_dir)
