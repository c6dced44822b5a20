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
# module.x_function or module.xǁClassǁmethod, then __mutmut_N; mutmut leaves properties
# alone, so VersionedTable.last_write_wins is checked only through the snapshot reads)
COMMIT_FUNCTIONS = (
    "service.meta.barriers.x_try_complete__mutmut_*",
    "service.meta.barriers.x__complete__mutmut_*",
    "service.meta.barriers.x_merge_ceiling__mutmut_*",
    "service.meta.barriers.x__merge_ceiling__mutmut_*",
    "service.meta.barriers.x_trim_history__mutmut_*",
    "spark_workers.actors.x_fence__mutmut_*",
    "spark_workers.actors.xǁActorRunnerǁ_fence__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁsnapshot*__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁ_snapshot_branches__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁlatest_versions__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁchange_log_range__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁrollback__mutmut_*",
    "state_store.versioned.xǁVersionedTableǁgc__mutmut_*",
)

SET_DESCRIPTIONS = {
    "core": "`backfill_core/executors/` and `backfill_core/vnode.py` against the unit and "
    "property tests.",
    "commit": "The commit, fence and visibility functions (`COMMIT_FUNCTIONS` in "
    "`tests/kit/mutation.py`) against their Postgres tests.",
}

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
            "tests/integration/test_meta_creating.py",
            "tests/integration/test_fence_mutants.py",
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


def _drop_plain_copies() -> None:
    """mutmut takes a file in mutants/ newer than its source for one it mutated already; a
    run of the other set copied this set's files there unmutated: drop those copies."""
    from mutmut.utils.file_utils import walk_mutatable_files

    for path in walk_mutatable_files():
        copy = Path("mutants") / path
        if not Path(f"{copy}.meta").exists():
            copy.unlink(missing_ok=True)


def run(chosen: MutationSet, jobs: int) -> None:
    from mutmut.__main__ import _run

    os.environ["HYPOTHESIS_PROFILE"] = "mutation"
    server = None
    if chosen.postgres and not os.environ.get("TEST_DATABASE_URL"):
        from service.embedded_pg import EmbeddedPostgres

        server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="mutation-pg-")), stop_on_exit=True)
        os.environ["TEST_DATABASE_URL"] = server.start()
    _forget_project_modules()
    _drop_plain_copies()
    try:
        _run(list(chosen.mutants), jobs)
    finally:
        if server is not None:
            server.stop()


def _matches(name: str, chosen: MutationSet) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in chosen.mutants)


# Survivors no test can kill: the mutant behaves as the code does on every input the code
# can get. (function glob, glob over the one-line change, why). Matched by content, not by
# mutmut's numbers, which shift when the code around them changes; a survivor matching
# none is reported as not explained.
_FIRST_BARRIER = (
    "read once the first barrier set it: before, no read is planned and every other use "
    "waits for `started`"
)
_NO_READ = "no read either way"
EQUIVALENT: tuple[tuple[str, str, str], ...] = (
    ("*ǁ__init__", "*→ `self.started = None`", "`started` is only tested for truth"),
    ("*Snapshot*ǁ*", "*self.closed_epoch = *", "the snapshot's `closed_epoch` is never read"),
    ("*Snapshot*ǁ__init__", "*self.created = None*", "`created` is never read"),
    *(
        ("*ǁ__init__", f"*self.{attr} = *", _FIRST_BARRIER)
        for attr in ("closed_epoch", "snapshot_epoch", "open_epoch", "replayed_upto")
    ),
    ("*ǁ__init__", "*self.exhausted* = None*", _FIRST_BARRIER),
    (
        "*ǁ__init__",
        "*self.budget: int | None = None*",
        "no read is planned before the first barrier, which sets the budget (`epoch_budget` "
        "counts a None left over as 0)",
    ),
    ("*.x_epoch_budget", "*left: int | None = 1*", "every caller passes `left`"),
    (
        "*Source*ǁ__init__",
        "*self.epoch_rows = *",
        "before its first barrier a source actor reports 0 rows whatever the count, then resets it",
    ),
    (
        "*Source*ǁon_barrier",
        "*if (self.started) or True else 0*",
        "the count is 0 until the first barrier (no read is accounted before it)",
    ),
    (
        "*Source*ǁon_barrier",
        "*forwarding = None*",
        "forwarding, every split is finished: `finished` holds and the stage is set to itself",
    ),
    (
        "*ǁ_visible",
        "*NOT_STARTED and p.current_pos is None*",
        "a vnode not started has no position, a started one always has one",
    ),
    (
        "*VnodeReads*ǁ_read_limit",
        "*not self._reading() and not self.started*",
        f"the budget is 0 until the first barrier, and past the reading phase every vnode "
        f"is read to its end: {_NO_READ}",
    ),
    (
        "*Source*ǁplan_reads",
        "*not self.started and self.paused*",
        f"a paused actor's budget is 0 (`epoch_budget`): {_NO_READ}",
    ),
    (
        "*Source*ǁplan_reads",
        "*FORWARDING and not self.started or self.paused*",
        f"forwarding, every split is finished: {_NO_READ}",
    ),
    (
        "*Source*ǁplan_reads",
        "*if total < 0 or not pending*",
        f"a total of 0 gives every split a limit of 0: {_NO_READ}",
    ),
    (
        "*Source*ǁ_on_backfill_summary",
        "*last_visible <= last_offset*",
        "hidden rows after a last visible offset equal to the last one fail the next check",
    ),
    (
        "*Snapshot*ǁon_vnode_update",
        "*if (self.started) or True else p*",
        "`on_vnode_update` follows the barrier carrying the update: `started` always holds",
    ),
    (
        "*.x_split_key",
        "*else (* << 6*, split)*",
        "any constant above every partition number (an int32) sorts other ids last",
    ),
    (
        "*Mutationǁfrom_json",
        "*frozenset(int(a) for a in data.get(*",
        "`Mutation.add` / `stop` are never read (the meta acts on its own JSON of them)",
    ),
    (
        "*.x_check_vnode_read_planned_now",
        "*check_planned_now(None,*",
        "changes a message's text only",
    ),
    (
        "*Source*ǁ_check_read",
        '*`f"split {read.split}",` → `None,`*',
        "changes a message's text only",
    ),
    ("*.x_fence", "*for share*", "SQL keywords ignore case"),
    ("*ǁrollback", "*delete from {} where {}*", "SQL keywords ignore case"),
    ("*.x_fence", "*→ `graph_id, None`*", "changes a message's text only"),
    ("*ǁ_fence", "*self.recovery_seq, None)*", "the actor id is only named in the message"),
    ("*.x__normalized_decimal", '*format(n, "F")*', "`F` formats every Decimal as `f` does"),
    ("*.x_encode_value", "*ensure_ascii=None*", "`None` is as false as `False`"),
)


def _one_line(diff: str) -> str:
    """A unified diff of one mutant as ``old → new`` (its changed lines, stripped)."""
    removed = [ln[1:].strip() for ln in diff.splitlines() if ln[:1] == "-" and ln[:3] != "---"]
    added = [ln[1:].strip() for ln in diff.splitlines() if ln[:1] == "+" and ln[:3] != "+++"]
    return f"`{' '.join(removed)}` → `{' '.join(added) or '(removed)'}`"


def why_equivalent(name: str, change: str) -> str | None:
    function = name.rpartition("__mutmut_")[0]
    for function_glob, change_glob, why in EQUIVALENT:
        if fnmatch.fnmatchcase(function, function_glob) and fnmatch.fnmatchcase(
            change, change_glob
        ):
            return why
    return None


def report(chosen: MutationSet, set_name: str, elapsed_s: float | None) -> str:
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.file_utils import walk_mutatable_files

    _configure(chosen)
    lines = [
        f"{SET_DESCRIPTIONS[set_name]} mutmut {version('mutmut')}, Hypothesis profile "
        "`mutation` "
        f"(max_examples {os.environ.get('MUTATION_MAX_EXAMPLES', '60')})"
        + (f", {elapsed_s / 60:.0f} min on this machine" if elapsed_s is not None else "")
        + ". *score*: killed or timed out, of all mutants; *of the rest*: of those not "
        "equivalent.",
        "",
        "| file | mutants | killed | timeout | survived | of which equivalent | other "
        "| score | of the rest |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
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
        counts["total"] = len(statuses)
        for name, status in sorted(statuses.items()):
            if status in ("killed", "timeout"):
                continue
            change = _one_line(get_diff_for_mutant(name, path=path))
            why = why_equivalent(name, change) if status == "survived" else None
            counts["equivalent"] += why is not None
            survivors.append(f"- `{name}` ({status}): {change}: {why or '**not explained**'}")
        totals.update(counts)
        lines.append(_row(f"`{path}`", counts))
    lines += [_row("all", totals), "", "Survivors:", "", *(survivors or ["- none"])]
    return "\n".join(lines)


def _row(label: str, counts: Counter[str]) -> str:
    total, caught = counts["total"], counts["killed"] + counts["timeout"]
    other = total - caught - counts["survived"]
    return (
        f"| {label} | {total} | {counts['killed']} | {counts['timeout']} | "
        f"{counts['survived']} | {counts['equivalent']} | {other} | "
        f"{caught / max(1, total):.1%} | {caught / max(1, total - counts['equivalent']):.1%} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=sorted(SETS), default="core")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report-only", action="store_true", help="report the last run")
    parser.add_argument(
        "--record", action="store_true", help="write the report into bench/RESULTS.md"
    )
    args = parser.parse_args()
    chosen = SETS[args.set]
    _configure(chosen)
    elapsed = None
    if not args.report_only:
        start = time.monotonic()
        run(chosen, args.jobs)
        elapsed = time.monotonic() - start
    text = report(chosen, args.set, elapsed)
    print(text)
    if args.record:
        from bench.report import record_mutation

        print(f"recorded in {record_mutation(args.set, text)}")


if __name__ == "__main__":
    main()
