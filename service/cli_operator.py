"""The operator's commands of ``backfill``: ``jobs``, ``tables``, ``sources``, ``workers``, an HTTP
client of the API (no catalog access; any control plane the URL and token reach).

``-o json`` prints the API's JSON for scripts; the default is a table or a summary.
Errors print the API's code and message and exit 1 (2 when the service cannot be
reached or the command line is wrong). See docs/operations.md#operator-cli.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
WATCH_INTERVAL_S = 1.0
BAR_WIDTH = 24
DONE_STATES = frozenset({"created", "failed", "cancelled"})


class CliError(Exception):
    """An answer the command cannot go on from: printed, then the exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Api:
    """The API over HTTP with the operator's token; 4xx/5xx answers become CliError."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self.http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise CliError(f"cannot reach the control plane at {self.url}: {e}", 2) from None
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
                text = f"{err['code']}: {err['message']}"
            except (ValueError, KeyError, TypeError):
                text = r.text.strip() or r.reason_phrase
            raise CliError(f"{method} {path} answered {r.status_code} {text}")
        return r.json() if r.content else None

    def pages(self, path: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list (``next`` passed back as ``after``)."""
        after: Any = None
        while True:
            query = {k: v for k, v in params.items() if v is not None}
            if after is not None:
                query["after"] = after
            page = self.call("GET", path, params=query)
            yield from page[key]
            after = page.get("next")
            if after is None:
                return


# output ---------------------------------------------------------------------


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list) and all(isinstance(x, dict) and "name" in x for x in v):
        return ", ".join(" ".join(str(x[k]) for k in ("name", "type") if k in x) for x in v)
    if isinstance(v, dict | list):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], out: TextIO) -> None:
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    for line in ([c.upper() for c in columns], *cells):
        out.write("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())
        out.write("\n")


def print_fields(doc: dict[str, Any], out: TextIO, skip: Sequence[str] = ()) -> None:
    width = max((len(k) for k in doc), default=0)
    for k, v in doc.items():
        if k not in skip:
            out.write(f"{k.ljust(width)}  {_cell(v)}\n")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def progress_line(job: dict[str, Any], progress: dict[str, Any]) -> str:
    """One job's progress as a bar: percent, rows, rows/s, ETA, phase, lag."""
    percent = float(progress.get("percent") or 0.0)
    filled = min(BAR_WIDTH, int(percent / 100 * BAR_WIDTH))
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    parts = [
        f"{job['id']:>4} {job['name'][:20]:<20} [{bar}] {percent:6.2f}%",
        f"{progress.get('rows', 0):,}/{progress.get('total_estimate', 0):,} rows",
        f"{float(progress.get('rows_per_s') or 0):,.0f} rows/s",
        f"ETA {_duration(progress.get('eta_s'))}",
    ]
    if progress.get("state") != "creating":
        return "  ".join([*parts, str(progress.get("state"))])
    parts.append(str(progress.get("phase")))
    if progress.get("log_store_lag_ms") is not None:
        parts.append(f"lag {progress['log_store_lag_ms']} ms")
    return "  ".join(parts)


# commands -------------------------------------------------------------------

JOB_COLUMNS = ("id", "name", "kind", "state", "paused", "rate_limit", "parallelism")
JOB_COLUMNS += ("committed_epoch",)


def _emit(args: argparse.Namespace, doc: Any, human: Callable[[], None]) -> None:
    if args.output == "json":
        json.dump(doc, args.out, indent=2)
        args.out.write("\n")
    else:
        human()


def jobs_list(api: Api, args: argparse.Namespace) -> int:
    jobs = list(api.pages("/v1/jobs", "jobs", state=args.state))
    _emit(args, {"jobs": jobs}, lambda: print_table(jobs, JOB_COLUMNS, args.out))
    return 0


def jobs_show(api: Api, args: argparse.Namespace) -> int:
    job = api.call("GET", f"/v1/jobs/{args.job_id}")
    progress = api.call("GET", f"/v1/jobs/{args.job_id}/progress")

    def human() -> None:
        print_fields(job, args.out)
        args.out.write("\n" + progress_line(job, progress) + "\n")

    _emit(args, {"job": job, "progress": progress}, human)
    return 0


def jobs_create(api: Api, args: argparse.Namespace) -> int:
    if (args.table is None) == (args.source is None):
        raise CliError("name exactly one upstream: --table or --source", 2)
    body: dict[str, Any] = {
        "name": args.name,
        "upstream": {"table": args.table} if args.table else {"source": args.source},
        "backfill": args.kind,
    }
    if args.columns:
        body["columns"] = [c.strip() for c in args.columns.split(",") if c.strip()]
    if args.filter:
        try:
            body["filter"] = json.loads(args.filter)
        except ValueError as e:
            raise CliError(f"--filter is not JSON: {e}", 2) from None
    for key, value in (("parallelism", args.parallelism), ("rate_limit", args.rate_limit)):
        if value is not None:
            body[key] = value
    job = api.call("POST", "/v1/jobs", json=body)
    _emit(args, job, lambda: print_fields(job, args.out))
    return 0


def _steer(method: str, suffix: str, body: Callable[[argparse.Namespace], Any] | None = None):  # type: ignore[no-untyped-def]
    def run(api: Api, args: argparse.Namespace) -> int:
        kwargs = {"json": body(args)} if body is not None else {}
        job = api.call(method, f"/v1/jobs/{args.job_id}{suffix}", **kwargs)
        _emit(args, job, lambda: print_table([job], JOB_COLUMNS, args.out))
        return 0

    return run


def jobs_drop(api: Api, args: argparse.Namespace) -> int:
    api.call("DELETE", f"/v1/jobs/{args.job_id}")
    _emit(args, {"dropped": args.job_id}, lambda: args.out.write(f"dropped {args.job_id}\n"))
    return 0


def jobs_verify(api: Api, args: argparse.Namespace) -> int:
    params = {"epoch": args.epoch} if args.epoch is not None else {}
    v = api.call("GET", f"/v1/jobs/{args.job_id}/verify", params=params)
    _emit(args, v, lambda: print_fields(v, args.out))
    return 0 if v["equal"] else 1


def jobs_watch(
    api: Api, args: argparse.Namespace, sleep: Callable[[float], None] = time.sleep
) -> int:
    """Progress bars until every watched job is created, failed or cancelled (exit 1 if
    one failed or was cancelled). No ids: the jobs creating now."""
    ids = list(args.job_ids) or [j["id"] for j in api.pages("/v1/jobs", "jobs", state="creating")]
    if not ids:
        args.out.write("no job is creating\n")
        return 0
    tty = args.out.isatty() and args.output != "json"
    drawn = 0
    while True:
        jobs = [api.call("GET", f"/v1/jobs/{i}") for i in ids]
        progress = [api.call("GET", f"/v1/jobs/{i}/progress") for i in ids]
        if args.output == "json":
            for p in progress:
                args.out.write(json.dumps(p, separators=(",", ":")) + "\n")
        else:
            if tty and drawn:
                args.out.write(f"\x1b[{drawn}F\x1b[J")  # redraw the bars in place
            lines = [progress_line(j, p) for j, p in zip(jobs, progress, strict=True)]
            args.out.write("\n".join(lines) + "\n")
            drawn = len(lines)
        args.out.flush()
        if all(j["state"] in DONE_STATES for j in jobs):
            return 0 if all(j["state"] == "created" for j in jobs) else 1
        sleep(args.interval)


WORKER_COLUMNS = ("id", "name", "state", "capacity", "actors", "last_heartbeat_at")


def workers_list(api: Api, args: argparse.Namespace) -> int:
    found = api.call("GET", "/v1/workers", params={"include_gone": args.include_gone})
    rows = [
        w | {"actors": f"{len(w['actors'])}: " + ",".join(str(a["id"]) for a in w["actors"])}
        for w in found["workers"]
    ]
    _emit(args, found, lambda: print_table(rows, WORKER_COLUMNS, args.out))
    return 0


def _lister(path: str, key: str, columns: Sequence[str]):  # type: ignore[no-untyped-def]
    def run(api: Api, args: argparse.Namespace) -> int:
        items = list(api.pages(path, key))
        _emit(args, {key: items}, lambda: print_table(items, columns, args.out))
        return 0

    return run


def _shower(path: str):  # type: ignore[no-untyped-def]
    def run(api: Api, args: argparse.Namespace) -> int:
        doc = api.call("GET", f"{path}/{args.name}")
        _emit(args, doc, lambda: print_fields(doc, args.out))
        return 0

    return run


# the parser -----------------------------------------------------------------


def non_negative_int(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {n}")
    return n


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _client_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("BACKFILL_URL", DEFAULT_URL),
        help=f"control plane base URL (env BACKFILL_URL; default {DEFAULT_URL})",
    )
    common.add_argument(
        "--token",
        default=os.environ.get("BACKFILL_TOKEN"),
        help="bearer token (env BACKFILL_TOKEN)",
    )
    common.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="output format"
    )
    return common


def add_operator_commands(sub: Any) -> None:
    """``jobs``, ``tables``, ``sources`` and ``workers`` under ``backfill``'s subcommands."""
    common = _client_options()

    def action(group: Any, name: str, text: str, run: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = group.add_parser(name, help=text, parents=[common])
        p.set_defaults(func=run_operator, run=run)
        return p

    j = sub.add_parser("jobs", help="list, create, steer, verify and watch jobs")
    js = j.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    action(js, "list", "list jobs", jobs_list).add_argument(
        "--state", choices=("creating", "created", "failed", "cancelled")
    )
    action(js, "show", "a job and its progress", jobs_show).add_argument("job_id", type=int)
    c = action(js, "create", "create a materialized view and its backfill", jobs_create)
    c.add_argument("name")
    c.add_argument("--table", help="the upstream table or view")
    c.add_argument("--source", help="the upstream Kafka source")
    c.add_argument("--columns", help="comma-separated columns (default: all)")
    c.add_argument("--filter", help='a filter as JSON, e.g. \'{"col":"a","op":">","value":1}\'')
    c.add_argument(
        "--kind",
        choices=("auto", "arrangement", "chain", "snapshot", "source"),
        default="auto",
        help="the backfill kind (default auto)",
    )
    c.add_argument("--parallelism", type=positive_int)
    c.add_argument("--rate-limit", type=non_negative_int, help="rows/s per actor (0: paused)")
    for name, text, run in (
        ("pause", "pause a job", _steer("POST", "/pause")),
        ("resume", "resume a paused job", _steer("POST", "/resume")),
        ("retry", "start a failed job again", _steer("POST", "/retry")),
        ("drop", "drop a job and its view", jobs_drop),
    ):
        action(js, name, text, run).add_argument("job_id", type=int)
    t = action(
        js,
        "throttle",
        "set a job's rate limit",
        _steer("PATCH", "", lambda a: {"rate_limit": None if a.rate == "none" else int(a.rate)}),
    )
    t.add_argument("job_id", type=int)
    t.add_argument("rate", help="rows/s per actor, 0 to hold still, `none` to lift the limit")
    r = action(js, "rescale", "change a job's parallelism", _steer("PATCH", "", _parallelism_body))
    r.add_argument("job_id", type=int)
    r.add_argument("parallelism", type=positive_int)
    v = action(js, "verify", "compare a view with its upstream (exit 1: differs)", jobs_verify)
    v.add_argument("job_id", type=int)
    v.add_argument("--epoch", help="a committed epoch (default: the latest)")
    w = action(js, "watch", "progress bars until the jobs are created", jobs_watch)
    w.add_argument("job_ids", type=int, nargs="*", help="default: every job creating now")
    w.add_argument("--interval", type=float, default=WATCH_INTERVAL_S, help="seconds")

    for noun, path, columns in (
        ("tables", "/v1/tables", ("name", "kind", "columns", "primary_key")),
        ("sources", "/v1/sources", ("name", "kafka", "columns", "rate_limit")),
    ):
        g = sub.add_parser(noun, help=f"list and show {noun}")
        gs = g.add_subparsers(dest=f"{noun}_command", required=True, metavar="ACTION")
        action(gs, "list", f"list {noun}", _lister(path, noun, columns))
        action(gs, "show", f"one of the {noun}", _shower(path)).add_argument("name")
    k = sub.add_parser("workers", help="list the workers and their actors")
    ks = k.add_subparsers(dest="workers_command", required=True, metavar="ACTION")
    action(
        ks, "list", "workers with their capacity, heartbeat and actors", workers_list
    ).add_argument("--include-gone", action="store_true", help="also dead and deregistered workers")


def _parallelism_body(args: argparse.Namespace) -> dict[str, Any]:
    return {"parallelism": args.parallelism}


def _validate_rate(args: argparse.Namespace) -> None:
    rate = getattr(args, "rate", None)
    if rate is not None and rate != "none" and not (rate.isdigit()):
        raise CliError(f"rate must be a number of rows/s or `none`, got {rate!r}", 2)


def run_operator(args: argparse.Namespace) -> int:
    args.out = getattr(args, "out", sys.stdout)
    api = Api(args.url, args.token)
    try:
        _validate_rate(args)
        return int(args.run(api, args))
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        api.close()
