"""Every relative link of the README and of docs/*.md points to a file of the
repository, and every `#anchor` to a heading of its target, as GitHub renders them."""
import re
from pathlib import Path

import pytest

from paths import REPO

ROOT = Path(REPO).resolve()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target); a target ends at a space (an optional title follows).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, …


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """The file's lines outside fenced code blocks, numbered from 1, inline code removed."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lower-cased, without punctuation, spaces as '-'."""
    text = INLINE_LINK.sub(r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(path):
        line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
        found += [(number, target) for target in LINK.findall(line)]
    return found


def broken(path: Path, root: Path = ROOT) -> list[str]:
    """One line for each relative link of `path` that does not resolve inside `root`."""
    problems = []
    for number, target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if root not in dest.parents:
            problems.append(f"{where}: outside the repository")
        elif not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading with this anchor in {dest.relative_to(root)}")
    return problems


def test_slug_follows_github():
    assert slug("Submit a job: `POST /jobs`") == "submit-a-job-post-jobs"
    assert slug("Sizing gunicorn: threads and `LONG_POLL_MAX_WAITERS`") == \
        "sizing-gunicorn-threads-and-long_poll_max_waiters"
    assert slug("Slow clients: 1,000 slow connections") == "slow-clients-1000-slow-connections"
    assert slug("How jobs run, and what Corral guarantees") == "how-jobs-run-and-what-corral-guarantees"


def test_the_checks_catch_broken_links(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Some part\n\n[ok](#some-part) [ok](b.md#b)\n"
                                   "[bad](#nothing) [bad](c.md) [web](https://example.com/x)\n"
                                   "```\n[in code](nowhere.md)\n```\n`[in a span](nowhere.md)`\n",
                                   encoding="utf-8")
    (tmp_path / "b.md").write_text("# B\n", encoding="utf-8")
    problems = broken(tmp_path / "a.md", tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == ["#nothing: no heading with this anchor in a.md",
                                                       "c.md: no such file"]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    problems = broken(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_doc_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in links(ROOT / "README.md")
              if not EXTERNAL.match(target)}
    missing = [str(p.relative_to(ROOT)) for p in DOCS[1:] if p.resolve() not in linked]
    assert not missing, f"docs the README does not link: {missing}"
