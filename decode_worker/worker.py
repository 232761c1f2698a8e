"""`pdspec decode`: start vLLM as a decode worker (its role: role.py)."""

from decode_worker import role
from pdspec.settings import DecodeCommand
from pdspec.worker.launch import exec_worker


def run(command: DecodeCommand) -> None:
    exec_worker(role.NAME, command.model, command.worker, command.run_dir)
