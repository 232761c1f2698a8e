"""Checks shared by the compose and Kubernetes tests: the PDSPEC_* variables and pdspec
commands a deployment file uses must be ones pdspec's own settings accept, so a renamed
setting cannot break a deployment silently (settings ignore unknown variables)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

from pydantic import BaseModel

from pdspec import cli
from pdspec import settings as s

ROOT = Path(__file__).resolve().parents[1]
# Where the images put deploy/profiles (deploy/docker/Dockerfile).
IMAGE_PROFILES = "/opt/pdspec/profiles/"
# Read by pdspec outside the settings classes (pdspec/settings.py: default_home, CONFIG_ENV).
NON_FIELD_VARIABLES = {"PDSPEC_HOME", s.CONFIG_ENV}

COMMAND_CLASSES = {name: settings_cls for name, (settings_cls, _) in cli.COMMANDS.items()}


def field_path(command_cls: type[BaseModel], variable: str) -> list[str] | None:
    """`PDSPEC_WORKER__PORT` -> ['worker', 'port'] when that field exists, else None."""
    parts = variable[len(s.ENV_PREFIX) :].lower().split("__")
    model: type[BaseModel] = command_cls
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return None
        if i < len(parts) - 1:
            sub = field.annotation
            if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
                return None
            model = sub
    return parts


def _same(value: object, raw: str) -> bool:
    if isinstance(value, Path):
        return str(value) == raw
    if isinstance(value, str):
        return value == raw
    try:
        return value == json.loads(raw)
    except json.JSONDecodeError:
        return False


def settings_problems(command: str, env: dict[str, str]) -> list[str]:
    """What in `env` (a container's environment) pdspec `command` would not take."""
    if command not in COMMAND_CLASSES:
        return [f"`pdspec {command}` is not a pdspec command"]
    command_cls = COMMAND_CLASSES[command]
    problems = []
    pdspec_env = {k: str(v) for k, v in env.items() if k.startswith(s.ENV_PREFIX)}
    for variable in pdspec_env:
        if variable not in NON_FIELD_VARIABLES and field_path(command_cls, variable) is None:
            problems.append(f"{variable}: no such setting for `pdspec {command}`")
    config = pdspec_env.get(s.CONFIG_ENV)
    if config is not None:
        if (
            not config.startswith(IMAGE_PROFILES)
            or not (ROOT / "deploy/profiles" / config[len(IMAGE_PROFILES) :]).is_file()
        ):
            problems.append(f"{s.CONFIG_ENV}={config}: not a profile the images ship (deploy/profiles)")
            pdspec_env.pop(s.CONFIG_ENV)
        else:
            pdspec_env[s.CONFIG_ENV] = str(ROOT / "deploy/profiles" / config[len(IMAGE_PROFILES) :])
    if problems:
        return problems
    clean = {k: v for k, v in os.environ.items() if not k.startswith(s.ENV_PREFIX)}
    with mock.patch.dict(os.environ, {**clean, **pdspec_env}, clear=True):
        try:
            loaded = command_cls()
        except Exception as exc:  # a value the setting refuses
            return [f"`pdspec {command}` refuses this environment: {exc}"]
    for variable, raw in pdspec_env.items():
        if variable in NON_FIELD_VARIABLES:
            continue
        value: object = loaded
        for part in field_path(command_cls, variable) or []:
            value = getattr(value, part)
        if not _same(value, raw):
            problems.append(f"{variable}={raw!r} was read as {value!r}")
    return problems
