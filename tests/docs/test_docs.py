"""The documentation: mkdocs builds it strictly (a broken link or anchor between its pages fails the build),
the built pages load nothing from the network, and every relative link of the README and of the pages
(files, and #anchors as GitHub renders the Markdown) leads somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
# [text](target) and ![alt](target); the text may hold code spans (removed first) but no brackets
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
HTML_ID = re.compile(r"""\sid=["']([^"']+)["']""")
NETWORK_ASSET = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.I)


def _require_mkdocs() -> None:
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        message = "the docs tests need mkdocs (the `docs` extra: pip install -e '.[docs]')"
        if os.environ.get("CI"):
            pytest.fail(message)  # `make test` installs it: a skip there would hide a broken setup
        pytest.skip(message)


def build(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    _require_mkdocs()
    out = tmp_path_factory.mktemp("site")
    done = build(out)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    yield out


def prose(markdown: str) -> str:
    """The Markdown without code blocks, code spans and comments: what links and headings are read from."""
    return CODE_SPAN.sub("", HTML_COMMENT.sub("", FENCE.sub("", markdown)))


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: its text, lower case, without punctuation, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    return {github_anchor(h) for h in HEADING.findall(FENCE.sub("", HTML_COMMENT.sub("", markdown)))}


def relative_links(page: Path) -> Iterator[str]:
    for target in LINK.findall(prose(page.read_text())):
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked here
            yield target


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file does not exist or whose #anchor no heading of it has."""
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file.read_text())):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {file.name}")
    return broken


def test_the_docs_build_strictly_and_load_nothing_from_the_network(site: Path) -> None:
    pages = sorted(site.glob("*.html"))
    assert {p.stem for p in pages} >= {md.stem for md in DOCS.glob("*.md")}
    for page in pages:
        assert not NETWORK_ASSET.search(page.read_text()), f"{page.name} loads something from the network"


def test_the_readme_links_resolve_on_github_and_in_the_built_site(site: Path) -> None:
    assert list(relative_links(README)), "the README links to no docs page"
    broken = broken_links(README)
    assert not broken, "\n".join(broken)
    for target in relative_links(README):
        path, _, anchor = target.partition("#")
        if path.startswith("docs/") and path.endswith(".md") and anchor:
            built = site / Path(path).relative_to("docs").with_suffix(".html")
            assert anchor in HTML_ID.findall(built.read_text()), f"{target}: #{anchor} is not an id in {built.name}"


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_a_docs_pages_links_resolve_on_github_too(page: str) -> None:
    """mkdocs checks the anchors with its own ids; GitHub shows these pages too, with its own."""
    broken = broken_links(DOCS / page)
    assert not broken, "\n".join(broken)


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    """A copy of the docs with one bad anchor and one missing page: the strict build must refuse both."""
    _require_mkdocs()
    copy = tmp_path / "repo"
    (copy / "docs").mkdir(parents=True)
    for md in DOCS.glob("*.md"):
        (copy / "docs" / md.name).write_text(md.read_text())
    (copy / "docs" / "images").symlink_to(DOCS / "images")
    (copy / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text())
    for bad, said in (("[x](verdicts.md#no-such-heading)", "no-such-heading"), ("[x](no-such-page.md)", "no-such-page.md")):
        index = copy / "docs" / "index.md"
        index.write_text((DOCS / "index.md").read_text() + f"\n{bad}\n")
        done = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
            cwd=copy, capture_output=True, text=True, timeout=300,
        )
        assert done.returncode != 0 and said in done.stderr + done.stdout, done.stderr
    # and the README check sees a broken one
    readme = copy / "README.md"
    readme.write_text("[a](docs/verdicts.md#no-such-heading) [b](docs/nothing.md) [c](docs/verdicts.md#against-simpler-rules)\n")
    assert len(broken_links(readme)) == 2
