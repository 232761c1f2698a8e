"""docs/configuration.md is what `python -m pdspec.settings_reference` renders from the settings
models, and the renderer walks any nesting of models without knowing their names."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from pdspec import settings_reference
from pdspec.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"


def test_the_checked_in_page_is_what_the_settings_render():
    # Stale after a settings change: run `python -m pdspec.settings_reference` and commit the page.
    assert PAGE.read_text() == settings_reference.render(), "docs/configuration.md is stale"


def leaf_fields(model: type[BaseModel]) -> set[str]:
    names = set()
    for name, info in model.model_fields.items():
        inner = settings_reference.directly_nested(info.annotation)
        names |= leaf_fields(inner) if inner is not None else {name}
    return names


def test_every_field_of_every_command_has_a_row():
    page = settings_reference.render()
    rows = {line.split("|")[1].strip().strip("`") for line in page.splitlines() if line.startswith("| `")}
    for settings_cls, _ in COMMANDS.values():
        assert leaf_fields(settings_cls) <= rows, settings_cls.__name__


class Innermost(BaseModel):
    """Deepest group."""

    depth_limit: int = Field(3, ge=1, description="How deep | it goes <here>.")


class Middle(BaseModel):
    inner: Innermost = Field(default_factory=Innermost)
    mode: Literal["a", "b"] = "a"


class Derived(Middle):
    mode: Literal["a", "b"] = "b"


class Toy(BaseSettings):
    """`toy`: a command of nested groups."""

    model_config = SettingsConfigDict(env_prefix="TOY_", env_nested_delimiter="__")
    outer: Middle = Field(default_factory=Middle)
    other: Derived = Field(default_factory=Derived)
    optional: Innermost | None = None
    flag: bool = False


def test_nested_groups_are_walked_at_any_depth_with_their_spellings():
    page = settings_reference.render({"toy": Toy})
    assert "`--outer.inner.<field>`, `TOY_OUTER__INNER__<FIELD>`, TOML `[outer.inner]`" in page
    assert "`--other.inner.<field>`, `TOY_OTHER__INNER__<FIELD>`, TOML `[other.inner]`" in page
    assert "| `depth_limit` | `int` (≥ 1) | `3` | How deep \\| it goes &lt;here>. |" in page
    # A subclass lists only what it changes, and links its base.
    derived = page.split("### Derived", 1)[1]
    assert "Every field of [Middle](#middle); these differ:" in derived
    assert '| `mode` | `"a" \\| "b"` | `"b"` |' in derived and "| `inner` |" not in derived
    assert "| `flag` | `--flag` | `TOY_FLAG` | `bool` | `false` |" in page
    # A group that may be left out is a group still (dotted names), unset by default.
    assert "| `optional` | `--optional.*` | `TOY_OPTIONAL__*` | [Innermost](#innermost) \\| None | *unset* |" in page
    assert "`--optional.<field>`, `TOY_OPTIONAL__<FIELD>`, TOML `[optional]`" in page


def test_defaults_do_not_depend_on_the_machine(monkeypatch, tmp_path):
    plain = settings_reference.render()
    monkeypatch.setenv("PDSPEC_HOME", str(tmp_path))
    assert settings_reference.render() == plain
    assert str(tmp_path) not in plain and str(Path.home()) not in plain


def test_check_mode_says_whether_the_page_is_stale(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    assert settings_reference.main(["--out", str(out), "--check"]) == 1
    assert settings_reference.main(["--out", str(out)]) == 0
    assert settings_reference.main(["--out", str(out), "--check"]) == 0
    out.write_text(out.read_text() + "edited by hand\n")
    assert settings_reference.main(["--out", str(out), "--check"]) == 1
    assert "is stale" in capsys.readouterr().err
