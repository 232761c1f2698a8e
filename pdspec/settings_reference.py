"""`python -m pdspec.settings_reference`: write docs/configuration.md, the settings reference.

The page is rendered from the settings models themselves, so it cannot drift from them:
every command of `pdspec.cli.COMMANDS`, every field of its settings class, and every
model nested in one (at any depth, found by walking the field types, never by name),
each with its type, constraints, default and description, and the spellings a field has
on the command line, in the environment and in a TOML file (read from the command's
`model_config`). A model that subclasses another documented model lists only the fields
it changes. `tests/unit/test_settings_reference.py` fails when the checked-in page
differs from what this renders, so a settings change comes with its page.

Contract: `render()` is a pure function of the models (defaults are computed with the
settings' own environment variables removed and the home directory written `~`, so the
page is the same on every machine). Failure policy: `--check` exits 1 and names the file
when it is stale; a model this cannot describe (a field type it does not know) is shown
by its Python name rather than refused.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import inspect
import json
import os
import re
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

DEFAULT_OUT = Path("docs/configuration.md")
GENERATOR = "python -m pdspec.settings_reference"
CONSTRAINTS = (
    ("ge", "≥"),
    ("gt", ">"),
    ("le", "≤"),
    ("lt", "<"),
    ("min_length", "length ≥"),
    ("max_length", "length ≤"),
)


@dataclass
class Group:
    """A model class documented once, with every place a command reaches it."""

    model: type[BaseModel]
    uses: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (command, path of field names)


def nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The model classes inside a field's type (`Model`, `Model | None`, `list[Model]`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in nested_models(arg)]


def directly_nested(annotation: Any) -> type[BaseModel] | None:
    """The model a field *is* (alone or with None), whose fields get dotted names; None otherwise."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        models = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(models) == 1:
            return directly_nested(models[0])
    return None


def documented_base(model: type[BaseModel]) -> type[BaseModel] | None:
    """The nearest base class that is itself a settings model with fields (not pydantic's own)."""
    for base in model.__mro__[1:]:
        if base in (BaseModel, BaseSettings) or not (isinstance(base, type) and issubclass(base, BaseModel)):
            continue
        if base.model_fields:
            return base
    return None


def collect_groups(commands: Mapping[str, type[BaseSettings]]) -> list[Group]:
    """Every model reached from the commands, depth first, each base before its first subclass."""
    groups: dict[type[BaseModel], Group] = {}

    def add(model: type[BaseModel]) -> Group:
        if model not in groups:
            base = documented_base(model)
            if base is not None and not issubclass(model, BaseSettings):
                add(base)
            groups[model] = Group(model)
            for sub in model.model_fields.values():
                for inner in nested_models(sub.annotation):
                    add(inner)
        return groups[model]

    def walk(command: str, model: type[BaseModel], path: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            group_model = directly_nested(info.annotation)
            if group_model is not None:
                add(group_model).uses.append((command, (*path, name)))
                walk(command, group_model, (*path, name))
            else:
                for inner in nested_models(info.annotation):
                    add(inner)

    for command, settings_cls in commands.items():
        walk(command, settings_cls, ())
    return list(groups.values())


def anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def link(model: type[BaseModel]) -> str:
    return f"[{model.__name__}](#{anchor(model)})"


def type_name(annotation: Any, linked: bool = True) -> str:
    """A field type as a reader writes it: `int`, `"pull" | "push"`, `list[str]`, `str | None`."""
    origin = get_origin(annotation)
    if annotation is type(None):
        return "None"
    if origin is typing.Annotated:
        return type_name(get_args(annotation)[0], linked)
    if origin is Literal:
        values = [value.value if isinstance(value, enum.Enum) else value for value in get_args(annotation)]
        return " | ".join(json.dumps(value) for value in values)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg, linked) for arg in get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(arg, linked) for arg in get_args(annotation))
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{args}]" if args else name
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return link(annotation) if linked else annotation.__name__
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def constraints(info: FieldInfo) -> str:
    found = []
    for item in info.metadata:
        for attribute, sign in CONSTRAINTS:
            value = getattr(item, attribute, None)
            if value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


@contextlib.contextmanager
def plain_environment(env_prefix: str) -> Iterator[None]:
    """Defaults as a fresh machine sees them: none of the settings' own variables set."""
    saved = {name: value for name, value in os.environ.items() if env_prefix and name.startswith(env_prefix)}
    for name in saved:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(saved)


def literal(value: Any) -> str:
    """A default as TOML and JSON write it (the home directory as `~`)."""
    home = str(Path.home())

    def plain(item: Any) -> Any:
        if isinstance(item, PurePath):
            text = str(item)
            return "~" + text[len(home) :] if text == home or text.startswith(home + os.sep) else text
        if isinstance(item, enum.Enum):
            return item.value
        if isinstance(item, BaseModel):
            return item.model_dump(mode="json")
        raise TypeError(type(item).__name__)

    try:
        return json.dumps(value, default=plain, ensure_ascii=False)
    except TypeError:
        return repr(value)


def default_of(info: FieldInfo, env_prefix: str) -> str:
    if info.default_factory is not None:
        with plain_environment(env_prefix):
            value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "*required*"
    else:
        value = info.default
    return "*unset*" if value is None else code(literal(value))


def code(text: str) -> str:
    """An inline code span that survives any backticks inside it."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text: str) -> str:
    """Prose in a table cell: one line, pipes escaped, `<...>` outside code spans kept as text."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;")
    return "`".join(parts).replace("|", "\\|")


def description(info: FieldInfo) -> str:
    return cell(info.description or "")


def spellings(config: Mapping[str, Any], path: tuple[str, ...]) -> tuple[str, str, str]:
    """(CLI, environment, TOML) for one field path, as pydantic-settings reads them."""
    cli_name = ".".join(path)
    if config.get("cli_kebab_case"):
        cli_name = cli_name.replace("_", "-")
    env = str(config.get("env_prefix", "")) + str(config.get("env_nested_delimiter") or "__").join(path).upper()
    toml = f"[{'.'.join(path[:-1])}] {path[-1]}" if len(path) > 1 else path[-1]
    return f"--{cli_name}", env, toml


def field_row(info: FieldInfo, env_prefix: str) -> tuple[str, str, str]:
    """(type, default, description) cells; a nested group without a description takes its docstring's."""
    group = directly_nested(info.annotation)
    kind = type_name(info.annotation)
    limits = constraints(info)
    type_cell = (kind if group is not None else code(kind)) + (f" ({limits})" if limits else "")
    if group is not None:
        unset = info.default_factory is None and info.default is None
        default = "*unset*" if unset else "its group's defaults"
        return cell(type_cell), default, description(info) or cell(first_sentence(doc_of(group)))
    return cell(type_cell), default_of(info, env_prefix), description(info)


def field_table(fields: Mapping[str, FieldInfo], env_prefix: str, inherited: Mapping[str, FieldInfo] = {}) -> list[str]:
    """One row per field; a field redefined without a description shows the one it inherits."""
    lines = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for name, info in fields.items():
        kind, default, text = field_row(info, env_prefix)
        if not text and name in inherited:
            text = description(inherited[name])
        lines.append(f"| `{name}` | {kind} | {cell(default)} | {text} |")
    return lines


def changed_fields(model: type[BaseModel], base: type[BaseModel], env_prefix: str) -> dict[str, FieldInfo]:
    """The fields `model` adds to `base`, or gives another type, default or (non-empty) description."""
    changed = {}
    for name, info in model.model_fields.items():
        if name not in base.model_fields:
            changed[name] = info
            continue
        (kind, default, text), (base_kind, base_default, base_text) = (
            field_row(info, env_prefix),
            field_row(base.model_fields[name], env_prefix),
        )
        if (kind, default) != (base_kind, base_default) or (text and text != base_text):
            changed[name] = info
    return changed


def first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + dot.strip()


def doc_of(model: type) -> str:
    text = inspect.getdoc(model) or ""
    inherited = next((inspect.getdoc(base) for base in model.__mro__[1:] if base.__doc__), None)
    return "" if model.__doc__ is None or text == inherited else " ".join(text.split())


def examples(commands: Mapping[str, type[BaseSettings]]) -> dict[str, tuple[str, tuple[str, ...], FieldInfo]]:
    """The first nested scalar, boolean and list fields the walk meets, for the page's examples."""
    found: dict[str, tuple[str, tuple[str, ...], FieldInfo]] = {}

    def walk(command: str, model: type[BaseModel], path: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            group = directly_nested(info.annotation)
            if group is not None:
                walk(command, group, (*path, name))
            elif path:
                kind = get_origin(info.annotation) or info.annotation
                key = {bool: "bool", list: "list", int: "scalar", str: "scalar"}.get(kind)
                if key and key not in found:
                    found[key] = (command, (*path, name), info)

    for command, settings_cls in commands.items():
        walk(command, settings_cls, ())
    return found


def intro(commands: Mapping[str, type[BaseSettings]]) -> list[str]:
    first = next(iter(commands.values()))
    config = first.model_config
    env_prefix = str(config.get("env_prefix", ""))
    found = examples(commands)
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated by `{GENERATOR}` from `pdspec/settings.py`; do not edit by hand. -->",
        "",
        f"Generated from the settings models in `pdspec/settings.py` by `{GENERATOR}`; a unit test",
        "(`tests/unit/test_settings_reference.py`) fails when this page and the models disagree, so",
        "after changing a setting run the command and commit the page with the change.",
        "",
        "Every setting has one name, spelled three ways: on the command line (a dot between a group",
        "and its field), in the environment (the prefix, then a double underscore between a group",
        "and its field) and in a TOML file (a table per group):",
        "",
        "| CLI | environment | TOML |",
        "| --- | --- | --- |",
    ]
    if "scalar" in found:
        _, path, info = found["scalar"]
        cli, env, _ = spellings(config, path)
        value = literal(info.get_default(call_default_factory=False)).strip('"')
        table = ".".join(path[:-1])
        lines.append(f"| `{cli} {value}` | `{env}={value}` | `[{table}]` `{path[-1]} = {literal(info.default)}` |")
    lines += [
        "",
        "`pdspec <command> --help` lists a command's options. A TOML file is given with",
        "`pdspec --config FILE.toml <command>` or `PDSPEC_CONFIG=FILE.toml`; the command line beats",
        "the environment, which beats the file. A group set partly keeps its other defaults.",
    ]
    if "bool" in found:
        cli, _, _ = spellings(config, found["bool"][1])
        lines.append(f"A boolean is a flag: `{cli}` sets it, `--no-{cli[2:]}` clears it.")
    if "list" in found:
        cli, env, _ = spellings(config, found["list"][1])
        lines.append(
            f"Lists and tables take JSON on the command line and in the environment (`{cli} '[...]'`, `{env}='[...]'`)."
        )
    lines += [
        "`pdspec bench` has options of its own (`pdspec bench --help`; see [benchmarks](benchmarks.md)).",
        f"Defaults here are a fresh machine's: none of the `{env_prefix}*` variables set, `~` the",
        "home directory (`PDSPEC_HOME` moves the run and model folders under it).",
        "",
    ]
    return lines


def render(commands: Mapping[str, type[BaseSettings]] | None = None) -> str:
    """The whole page (Markdown) for the given commands, by default the CLI's."""
    if commands is None:
        from pdspec.cli import COMMANDS

        commands = {name: settings_cls for name, (settings_cls, _) in COMMANDS.items()}
    groups = collect_groups(commands)
    first = next(iter(commands.values()))
    env_prefix = str(first.model_config.get("env_prefix", ""))
    lines = intro(commands)

    lines += ["## Commands", "", "| command | what it runs | its settings |", "| --- | --- | --- |"]
    for name, settings_cls in commands.items():
        own = ", ".join(
            f"[`{field_name}`](#{anchor(group)})" if (group := directly_nested(info.annotation)) else f"`{field_name}`"
            for field_name, info in settings_cls.model_fields.items()
        )
        summary = re.sub(r"^`[^`]*`: ", "", doc_of(settings_cls))  # the docstring names the command first
        lines.append(f"| [`pdspec {name}`](#pdspec-{name}) | {cell(summary)} | {own} |")
    lines.append("")

    for name, settings_cls in commands.items():
        lines += [f"### `pdspec {name}`", ""]
        if doc := doc_of(settings_cls):
            lines += [doc, ""]
        lines += [
            "| setting | CLI | environment | type | default | description |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for field_name, info in settings_cls.model_fields.items():
            cli, env, _ = spellings(settings_cls.model_config, (field_name,))
            kind, default, text = field_row(info, env_prefix)
            if directly_nested(info.annotation) is not None:
                cli, env = f"`{cli}.*`", f"`{env}{settings_cls.model_config.get('env_nested_delimiter') or '__'}*`"
            else:
                cli, env = f"`{cli}`", f"`{env}`"
            lines.append(f"| `{field_name}` | {cli} | {env} | {kind} | {cell(default)} | {text} |")
        lines.append("")

    lines += ["## Groups", "", "Each settings group once, with the commands that read it and where.", ""]
    documented = {group.model for group in groups}
    for group in groups:
        model = group.model
        lines += [f"### {model.__name__}", ""]
        if doc := doc_of(model):
            lines += [doc, ""]
        if group.uses:
            lines.append("Set as:")
            lines.append("")
            by_path: dict[tuple[str, ...], list[str]] = {}
            for command, path in group.uses:
                by_path.setdefault(path, []).append(f"`pdspec {command}`")
            for path, where in by_path.items():
                cli, env, _ = spellings(commands[group.uses[0][0]].model_config, (*path, "FIELD"))
                env = env[: -len("FIELD")] + "<FIELD>"
                cli = cli[: -len("FIELD")] + "<field>"
                lines.append(f"- `{cli}`, `{env}`, TOML `[{'.'.join(path)}]`: {', '.join(where)}")
            lines.append("")
        else:
            subclasses = [other.model for other in groups if documented_base(other.model) is model]
            if subclasses:
                lines += ["Not set by itself: the base of " + ", ".join(link(sub) for sub in subclasses) + ".", ""]
        base = documented_base(model)
        if base is not None and base in documented:
            changed = changed_fields(model, base, env_prefix)
            lead = f"Every field of {link(base)}"
            lines += [f"{lead}; these differ:" if changed else f"{lead}, unchanged.", ""]
            if changed:
                lines += field_table(changed, env_prefix, base.model_fields)
                lines.append("")
        else:
            lines += field_table(model.model_fields, env_prefix)
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=GENERATOR, description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the page to write (default {DEFAULT_OUT})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is stale")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        current = args.out.read_text() if args.out.exists() else None
        if current != page:
            print(f"{args.out} is stale: run `{GENERATOR}`", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
