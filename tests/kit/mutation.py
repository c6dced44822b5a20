"""Mutation score (issue 39; ``make mutation``): mutmut plants one small change at a time in
the code whose mistakes lose data and runs the tests that reach it; a mutant no test
fails on (a survivor) is a mistake the suite would let through.

Two sets, each with the tests that can kill its mutants:

- ``core`` (the default): ``backfill_core/executors/`` and ``backfill_core/vnode.py``,
  against the fast unit and property tests (``[tool.mutmut]`` in pyproject.toml, so
  ``mutmut browse`` / ``mutmut show`` work on it too).
- ``commit``: the commit, fence and visibility functions of the meta, the workers and the
  store (``COMMIT_FUNCTIONS``), against the Postgres tests that exercise them (one embedded
  server for the whole run). Slower: every mutant runs Postgres-backed tests.

Property tests run under the hypothesis profile ``mutation`` (fewer examples, derandomized:
a mutant is killed or not, run after run). Every matched mutant is run again (mutmut would
keep an old survivor after a new test). The report is Markdown for ``bench/RESULTS.md``:
per file, the mutants killed, survived and timed out, then each survivor as a one-line diff.

    python -m tests.kit.mutation [--set core|commit] [--jobs N] [--report-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

# the packages mutmut copies into mutants/: none may stay imported from the source tree
_PROJECT_PACKAGES = ("backfill_core", "connectors", "migrations", "service", "spark_workers")
_PROJECT_PACKAGES += ("state_store", "tests")


@dataclass(frozen=True)
class MutationSet:
    files: tuple[str, ...]  # globs of the files mutated (mutmut's only_mutate)
    mutants: tuple[str, ...]  # globs of the mutant names run
    tests: tuple[str, ...] | None  # pytest arguments selecting the tests (None: pyproject's)
    postgres: bool = False


# functions whose mistakes commit, show or let through what they must not (mutmut names:
# module.x_function or module.xǁClassǁmethod, then __mutmut_N)
COMMIT_FUNCTIONS = (
    "service.meta.barriers.x_try_complete__mutmut_*",
    "service.meta.barriers.x_merge_ceiling__mutmut_*",
    "service.meta.barriers.x_trim_history__mutmut_*",
    "spark_workers.actors.x_fence__mutmut_*",
    "spark_workers.actors.xǁActorRunnerǁ_fence__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁlast_write_wins__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁsnapshot*__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁ_snapshot_branches__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁlatest_versions__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁchange_log_range__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁrollback__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁgc__mutmut_*",
)

SETS = {
    "core": MutationSet(
        files=("backfill_core/executors/*", "backfill_core/vnode.py"),
        mutants=("backfill_core.executors.*", "backfill_core.vnode.*"),
        tests=None,
    ),
    "commit": MutationSet(
        files=("service/meta/barriers.py", "spark_workers/actors.py", "state_store/versioned.py"),
        mutants=COMMIT_FUNCTIONS,
        tests=(
            "tests/integration/test_store_property.py",
            "tests/integration/test_meta_barriers.py",
            "tests/integration/test_zombie_fence.py",
            "tests/integration/test_epoch_boundaries.py",
            "tests/integration/test_gc.py",
        ),
        postgres=True,
    ),
}


def _configure(chosen: MutationSet) -> None:
    """mutmut reads its configuration from pyproject.toml only: replace the parts a set sets."""
    from mutmut import configuration

    cfg = configuration.config()
    changes: dict[str, object] = {"only_mutate": list(chosen.files)}
    if chosen.tests is not None:
        changes["pytest_add_cli_args_test_selection"] = list(chosen.tests)
    configuration._config = dataclasses.replace(cfg, **changes)  # type: ignore[arg-type]


def _forget_project_modules() -> None:
    """Tests run in mutants/ must import the mutated copies, not what this process loaded."""
    for name in list(sys.modules):
        if name.split(".")[0] in _PROJECT_PACKAGES:
            del sys.modules[name]


def run(chosen: MutationSet, jobs: int) -> None:
    from mutmut.__main__ import _run

    os.environ["HYPOTHESIS_PROFILE"] = "mutation"
    server = None
    if chosen.postgres and not os.environ.get("TEST_DATABASE_URL"):
        from service.embedded_pg import EmbeddedPostgres

        server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="mutation-pg-")), stop_on_exit=True)
        os.environ["TEST_DATABASE_URL"] = server.start()
    _forget_project_modules()
    try:
        _run(list(chosen.mutants), jobs)
    finally:
        if server is not None:
            server.stop()


def _matches(name: str, chosen: MutationSet) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in chosen.mutants)


def _one_line(diff: str) -> str:
    """A unified diff of one mutant as ``old → new`` (its changed lines, stripped)."""
    removed = [ln[1:].strip() for ln in diff.splitlines() if ln[:1] == "-" and ln[:3] != "---"]
    added = [ln[1:].strip() for ln in diff.splitlines() if ln[:1] == "+" and ln[:3] != "+++"]
    return f"`{' '.join(removed)}` → `{' '.join(added) or '(removed)'}`"


def report(chosen: MutationSet, set_name: str, elapsed_s: float | None) -> str:
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.file_utils import walk_mutatable_files

    _configure(chosen)
    lines = [
        f"- set `{set_name}`, mutmut {version('mutmut')}, hypothesis profile `mutation` "
        f"(max_examples {os.environ.get('MUTATION_MAX_EXAMPLES', '60')})"
        + (f", {elapsed_s / 60:.0f} min on this machine" if elapsed_s is not None else ""),
        "",
        "| file | mutants | killed | timeout | survived | other | killed or timeout |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    survivors: list[str] = []
    totals: Counter[str] = Counter()
    for path in sorted(walk_mutatable_files()):
        data = SourceFileMutationData(path=path)
        data.load()
        statuses = {
            name: status_by_exit_code[code]
            for name, code in data.exit_code_by_key.items()
            if _matches(name, chosen)
        }
        if not statuses:
            continue
        counts = Counter(statuses.values())
        other = len(statuses) - counts["killed"] - counts["timeout"] - counts["survived"]
        totals.update(counts)
        totals["total"] += len(statuses)
        score = (counts["killed"] + counts["timeout"]) / len(statuses)
        lines.append(
            f"| `{path}` | {len(statuses)} | {counts['killed']} | {counts['timeout']} | "
            f"{counts['survived']} | {other} | {score:.1%} |"
        )
        for name, status in sorted(statuses.items()):
            if status not in ("killed", "timeout", "not checked"):
                diff = get_diff_for_mutant(name, path=path)
                survivors.append(f"- `{name}` ({status}): {_one_line(diff)}")
    total = totals["total"]
    if total:
        score = (totals["killed"] + totals["timeout"]) / total
        lines.append(
            f"| all | {total} | {totals['killed']} | {totals['timeout']} | {totals['survived']} "
            f"| {total - totals['killed'] - totals['timeout'] - totals['survived']} | {score:.1%} |"
        )
    lines += ["", "Survivors:", "", *(survivors or ["- none"])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=sorted(SETS), default="core")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report-only", action="store_true", help="report the last run")
    args = parser.parse_args()
    chosen = SETS[args.set]
    _configure(chosen)
    elapsed = None
    if not args.report_only:
        start = time.monotonic()
        run(chosen, args.jobs)
        elapsed = time.monotonic() - start
    print(report(chosen, args.set, elapsed))


if __name__ == "__main__":
    main()
