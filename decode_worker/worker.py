"""`pdspec decode`: start vLLM as a decode worker."""

from pdspec.settings import WorkerCommand
from pdspec.worker.launch import exec_worker

ROLE = "decode"


def run(command: WorkerCommand) -> None:
    exec_worker(ROLE, command.model, command.worker, command.run_dir)
