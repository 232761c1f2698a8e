"""The README and docs/ hold together: every relative link and `#anchor` resolves (anchors as
GitHub makes them from headings), the README stays a front door that maps every page, and its
set-up block holds the two commands, both real Makefile targets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
README_MAX_LINES = 300
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "code", text)


def headings(text: str) -> list[str]:
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return [m.group(1) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lower case, punctuation dropped, spaces as -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(path.read_text()):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


def test_slugs_are_githubs():
    assert slug("Images (`deploy/docker/`)") == "images-deploydocker"
    assert slug("K=0 proposals on the prefill worker") == "k0-proposals-on-the-prefill-worker"
    assert slug("`pdspec up`") == "pdspec-up"
    assert slug("Faults: restarts and the chaos soak") == "faults-restarts-and-the-chaos-soak"
    assert slug("The hand-off on [one H200](x.md)") == "the-hand-off-on-one-h200"


def test_duplicate_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A\n\n```sh\n# not a heading\n```\n\n## A\n\n## B\n")
    assert anchors(page) == {"a", "a-1", "b"}


def test_links_in_code_are_not_links(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[real](a.md#x) `[fake](b.md)`\n\n```\n[fake](c.md)\n```\n![img](d.png)\n")
    assert relative_links(page) == ["a.md#x", "d.png"]


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in relative_links(page):
        file_part, _, fragment = target.partition("#")
        destination = (page.parent / file_part).resolve() if file_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target}: no heading makes #{fragment}")
    assert not broken


def test_the_readme_is_a_front_door_that_maps_every_page():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(README)}
    assert PAGES and not [p.name for p in PAGES if p.resolve() not in linked]


def test_the_readme_sets_up_with_the_two_make_targets():
    text = README.read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", setup, flags=re.S).group(1)
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.M))
    assert {"run", "test", "test-unit"} <= targets
