"""The documentation stays true to the repository: a README for users under 20 KB, links
that resolve (files and headings), no code comment pointing outside the repository, and
the README's CLI and configuration tables matching the code."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import report
from service.cli import build_parser
from service.settings import Settings
from spark_workers.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKDOWN = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench").glob("*.md"))]
PACKAGES = (
    "backfill_core",
    "service",
    "spark_workers",
    "state_store",
    "connectors",
    "bench",
    "tests",
)
README_MAX_BYTES = 20_000

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
# a docstring or comment citing a section of the repository's docs
DOC_ANCHOR = re.compile(r"((?:docs|bench)/[\w.-]+\.md)#([\w-]+)")
# the starting design and its review live outside the repository (cited as "DESIGN.md",
# "DESIGN section 5", "../shared/..."): docs/architecture.md is the design
OUTSIDE = re.compile(r"\bDESIGN\b|\.\./shared|design-review")


def _prose(text: str) -> str:
    """Markdown without fenced blocks and code spans (their brackets are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file, duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        slug = github_slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> Iterator[str]:
    for target in LINK.findall(_prose(path.read_text())):
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            yield target


def python_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from (p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def test_github_slugs() -> None:
    assert github_slug("The worker's read strategies") == "the-workers-read-strategies"
    assert github_slug("Sources (Kafka)") == "sources-kafka"
    assert github_slug("`backfill` and `make`: set-up") == "backfill-and-make-set-up"
    assert github_slug("A five-minute tour") == "a-five-minute-tour"


def test_readme_is_a_readme_for_users() -> None:
    size = README.stat().st_size
    assert size < README_MAX_BYTES, (
        f"README.md is {size} bytes; keep it under {README_MAX_BYTES} for users and move the "
        "rest to docs/ (design, operations, API) or bench/HISTORY.md (measurements)"
    )


@pytest.mark.parametrize("doc", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_no_python_file_points_outside_the_repository() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in python_files()
        if p != Path(__file__).resolve()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "cite docs/architecture.md instead:\n" + "\n".join(found)


def test_docstrings_cite_existing_sections() -> None:
    missing = []
    for p in python_files():
        for n, line in enumerate(p.read_text().splitlines(), 1):
            for doc, anchor in DOC_ANCHOR.findall(line):
                target = ROOT / doc
                if not target.exists() or anchor not in anchors(target):
                    missing.append(f"{p.relative_to(ROOT)}:{n}: {doc}#{anchor}")
    assert not missing, "no such section:\n" + "\n".join(missing)


def test_readme_configuration_table_names_every_setting() -> None:
    text = README.read_text()
    missing = []
    for name in [*Settings.model_fields, *WorkerSettings.model_fields]:
        env = "DATABASE_URL" if name == "database_url" else f"BACKFILL_{name.upper()}"
        if f"`{env}`" not in text:
            missing.append(env)
    assert not missing, f"README's configuration table lacks {missing}"


def test_readme_cli_table_names_every_command_and_option() -> None:
    text = README.read_text()
    missing = []

    def walk(parser: object, words: list[str]) -> None:
        for action in parser._actions:  # type: ignore[attr-defined]
            if action.option_strings and action.dest != "help":
                option = max(action.option_strings, key=len)
                if option not in text:
                    missing.append(f"{' '.join(words)} {option}")
            choices = getattr(action, "choices", None)
            for name, sub in (choices if isinstance(choices, dict) else {}).items():
                if hasattr(sub, "_actions"):
                    if f"{' '.join([*words, name])}" not in text:
                        missing.append(" ".join([*words, name]))
                    walk(sub, [*words, name])

    walk(build_parser(), ["backfill"])
    assert not missing, f"README's CLI table lacks {missing}"


def test_readme_figures_link_to_the_results() -> None:
    """A ratio quoted in the README is a figure of bench/RESULTS.md, linked there."""
    unlinked = [
        para.strip()[:80]
        for para in re.split(r"\n\s*\n|\n(?=\* )", _prose(README.read_text()))
        if re.search(r"\b\d+\.\d+x\b", para) and "bench/RESULTS.md" not in para
    ]
    assert not unlinked, f"figures without a link to bench/RESULTS.md: {unlinked}"


def test_results_md_is_what_the_report_writes() -> None:
    """bench/RESULTS.md is generated: its fixed text is the generator's."""
    committed = (ROOT / "bench" / "RESULTS.md").read_text()
    rendered = report.render({"modules": {}}, report.RESULTS_MD.parent)
    header = next(line for line in rendered.splitlines() if line.startswith("Written "))
    assert header.split("`bench/out/results.json`", 1)[1] in committed
    assert report.HOW_TO_READ in committed
    assert "[HISTORY.md](HISTORY.md)" in header


def test_results_md_records_the_mutation_score_of_every_set() -> None:
    """The mutation score and its survivors stand in bench/RESULTS.md (issue 39), each set
    with a score for every file it mutates; the executors' score is at least 90%."""
    kept = report.kept_mutation((ROOT / "bench" / "RESULTS.md").read_text())
    assert kept, "no `make mutation` run recorded in bench/RESULTS.md"
    for name in ("core", "commit"):
        assert f"### Set `{name}`" in kept
    assert "Survivors:" in kept
    row = next(ln for ln in kept.splitlines() if ln.startswith("| all |"))
    executors = [ln for ln in kept.splitlines() if ln.startswith("| `backfill_core/executors/")]
    assert executors and row
    killed = sum(int(ln.split("|")[3]) + int(ln.split("|")[4]) for ln in executors)
    total = sum(int(ln.split("|")[2]) for ln in executors)
    assert killed / total >= 0.9, f"executors: {killed} of {total} mutants killed"


def test_rewriting_results_md_keeps_the_mutation_score(tmp_path: Path) -> None:
    """``python -m bench`` rewrites RESULTS.md from results.json, which has no mutation
    score: the section make mutation wrote stays; a set's new run replaces its old part."""
    results, md = tmp_path / "results.json", tmp_path / "RESULTS.md"
    results.write_text('{"modules": {}}')
    report.write(results, md)
    assert report.NO_MUTATION_RUN in md.read_text()
    report.record_mutation("core", "core table, first run", md)
    report.record_mutation("commit", "commit table", md)
    report.record_mutation("core", "core table, second run", md)
    report.write(results, md)
    text = md.read_text()
    kept = report.kept_mutation(text)
    assert kept == "### Set `commit`\n\ncommit table\n\n### Set `core`\n\ncore table, second run"
    assert text.index(report.MUTATION_HEADING) < text.index("## Plots")
