"""The ``backfill`` command line: serve, worker, db, demo, openapi, and the operator's
commands over the HTTP API (jobs, tables, sources: ``service/cli_operator.py``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from service import heap
from service.cli_operator import add_operator_commands, positive_int
from service.embedded_pg import MISSING_PGSERVER, embedded_available
from service.logs import LogSettingsError, configure_logging_from_env
from service.settings import Settings, SettingsError, load_settings
from spark_workers.settings import WorkerSettings, WorkerSettingsError, load_worker_settings


def _settings_or_exit(**overrides: object):  # type: ignore[no-untyped-def]
    try:
        settings = load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if settings.embedded and not embedded_available():
        print(f"error: {MISSING_PGSERVER}", file=sys.stderr)
        raise SystemExit(2)
    return settings


def require_worker_extra(who: str = "`backfill worker`", otherwise: str = "") -> None:
    """A worker runs Spark: without the ``worker`` extra, say what to install instead of
    an ImportError's traceback (the base package is the control plane)."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        print(
            f"error: {who} needs pyspark and pyarrow ({e.name} is missing): "
            f"install mv-backfill[worker]{otherwise}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def require_java() -> None:
    """Spark needs Java 17; fail with a clear message instead of a JVM stack trace."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        print(
            "error: Java 17 is required by Spark but `java` was not found on PATH "
            "(install openjdk-17-jre-headless or set JAVA_HOME)",
            file=sys.stderr,
        )
        raise SystemExit(2)


GRACEFUL_SHUTDOWN_S = 5  # open event streams and long polls get this long to end


def _server_class(app: Any):  # type: ignore[no-untyped-def]
    import uvicorn

    class Server(uvicorn.Server):
        """Stops the embedded worker before the server (which the worker calls while it
        stops); open streams get a few seconds, not as long as they like."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            spawner = getattr(app.state, "spawner", None)
            if spawner is None or getattr(self, "stopping_worker", False):
                return super().handle_exit(sig, frame)  # a second signal: at once
            self.stopping_worker = True
            stop = super().handle_exit

            def worker_first() -> None:
                spawner.stop()
                stop(sig, frame)

            threading.Thread(target=worker_first, name="stop-worker", daemon=True).start()

    return Server


async def _serve(settings, on_ready=None, access_log: bool = True) -> None:  # type: ignore[no-untyped-def]
    import uvicorn

    from service.api.app import create_app

    app = create_app(settings)
    _Server = _server_class(app)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's loggers go to the root's handler (service/logs.py)
        lifespan="on",
        access_log=access_log,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1] if server.servers else settings.port
        url = f"http://{settings.host}:{port}"
        app.state.ctx.base_url = url
        if app.state.spawner is not None:
            # started before any job's actors are placed: a healthy start recovers nothing
            app.state.spawner.ensure()
        print(f"backfill control plane ready at {url}", flush=True)
        heap.settle_after_start()
        if on_ready is not None:
            try:
                await on_ready(url, app.state.ctx)
            finally:
                server.should_exit = True
    await task


def _exit_cleanly_on_sigterm() -> None:
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal; with this
    # handler in place the re-raised signal is a no-op and the process exits 0
    signal.signal(signal.SIGTERM, lambda *_: None)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings_or_exit(host=args.host, port=args.port, data_dir=args.data_dir)
    if settings.embedded and settings.spawn_embedded_worker:
        # the worker it spawns reads the same environment: a bad value fails here, once,
        # rather than in every restart of that worker
        _worker_settings_or_exit()
        require_worker_extra(
            "the worker `serve` starts beside an embedded Postgres",
            ", or set BACKFILL_SPAWN_EMBEDDED_WORKER=false and run workers elsewhere",
        )
    _exit_cleanly_on_sigterm()
    import uvloop

    # uvloop's event loop (and httptools' parser, which uvicorn picks when installed) do
    # in C what asyncio and h11 do in Python on the thread that answers every request:
    # the GIL it holds is what the request threads and the barrier loop wait for
    # Ctrl-C: uvicorn shuts down (worker first), then re-raises SIGINT, which the runner
    # turns into KeyboardInterrupt; the shutdown is over, nothing went wrong
    with (
        contextlib.suppress(KeyboardInterrupt),
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        runner.run(_serve(settings))
    return 0


def _worker_settings_or_exit() -> WorkerSettings:
    try:
        return load_worker_settings()
    except WorkerSettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _worker_settings_or_exit()
    require_worker_extra()
    require_java()
    from spark_workers.main import run_worker

    return run_worker(
        args.control_plane,
        name=args.name,
        capacity=args.capacity,
        settings=settings,
        parent_pid=args.parent_pid,
    )


def cmd_db(args: argparse.Namespace) -> int:
    from service import migrate
    from service.db import Database

    settings = _settings_or_exit(data_dir=args.data_dir)
    db = Database.from_settings(settings)
    try:
        if args.db_command == "upgrade":
            migrate.upgrade(db.engine, args.revision)
            print(f"database at revision {migrate.current_revision(db.engine)}")
        elif args.db_command == "downgrade":
            migrate.downgrade(db.engine, args.revision)
            print(f"database at revision {migrate.current_revision(db.engine)}")
        elif args.db_command == "create-worker-role":
            return _create_worker_role(db, settings, args.name, args.password_stdin)
        elif args.db_command == "create-reader-role":
            return _create_reader_role(db, args.role, args.password_env)
        else:
            current = migrate.current_revision(db.engine)
            print(f"current: {current}  head: {migrate.head_revision(db.engine)}")
    finally:
        db.close()
    return 0


def _create_worker_role(db, settings: Settings, name: str | None, password_stdin: bool) -> int:  # type: ignore[no-untyped-def]
    """Without a name: the role and password of BACKFILL_WORKER_DATABASE_URL, so that a
    deployment (the compose file's init step) states them once."""
    import psycopg2
    from sqlalchemy.engine import make_url

    from service.worker_role import create_worker_role

    password = sys.stdin.readline().rstrip("\n") if password_stdin else None
    if name is None:
        url = make_url(settings.worker_database_url) if settings.worker_database_url else None
        if url is None or not url.username:
            print(
                "error: give the role's name, or set BACKFILL_WORKER_DATABASE_URL with a user",
                file=sys.stderr,
            )
            return 2
        name = url.username
        if password is None and url.password is not None:
            password = str(url.password)
    conn = psycopg2.connect(db.libpq_url)
    try:
        created = create_worker_role(conn, name, password)
    finally:
        conn.close()
    print(f"worker role {name} {'created' if created else 'exists'}, its grants applied")
    return 0


def _create_reader_role(db, role: str, password_env: str | None) -> int:  # type: ignore[no-untyped-def]
    """A login role that may select from the views in ``mv`` and nothing else
    (docs/reading.md); its password comes from an environment variable, never argv."""
    from psycopg2 import errors

    from backfill_core.schema import SchemaError, validate_identifier
    from service import migrate
    from service.db import raw_cursor
    from state_store.reader_views import create_reader_role

    try:
        validate_identifier(role, "role name")
    except SchemaError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    if not migrate.at_head(db.engine):  # the schema mv comes with the migrations
        print("error: the catalog is not up to date: run `backfill db upgrade`", file=sys.stderr)
        return 1
    password = None
    if password_env is not None:
        password = os.environ.get(password_env)
        if not password:
            print(f"error: {password_env} is not set or empty", file=sys.stderr)
            return 2
    try:
        with db.transaction() as s:
            create_reader_role(raw_cursor(s), role, password)
    except errors.DuplicateObject:
        print(f"error: role {role!r} already exists", file=sys.stderr)
        return 1
    print(f"created role {role}: it may select from the views in schema mv")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from service.demo import demo_session

    settings = _settings_or_exit(port=args.port, data_dir=args.data_dir)
    asyncio.run(
        _serve(
            settings,
            on_ready=lambda url, ctx: demo_session(url, ctx, keep_running=args.keep_running),
            access_log=False,
        )
    )
    return 0


def cmd_openapi(args: argparse.Namespace) -> int:
    from service.api.openapi import render_openapi

    text = render_openapi()
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="backfill",
        description="Online backfill service for materialized views.",
        epilog="Settings come from BACKFILL_* environment variables; DATABASE_URL unset "
        "means an embedded Postgres under the data directory.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run the control plane (HTTP API, barriers, scheduler)")
    s.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=None, help="port to bind (default 8000, 0 = any)")
    s.add_argument(
        "--data-dir", default=None, help="embedded Postgres data directory (default .data)"
    )
    s.set_defaults(func=cmd_serve)

    w = sub.add_parser("worker", help="run a PySpark worker that executes backfill actors")
    w.add_argument("--control-plane", required=True, metavar="URL", help="control plane base URL")
    w.add_argument("--name", default=None, help="worker name (default: host name and pid)")
    w.add_argument(
        "--capacity",
        type=positive_int,
        default=64,
        help="how many actors the control plane may place on this worker (default: 64)",
    )
    w.add_argument(
        "--parent-pid",
        type=positive_int,
        default=None,
        metavar="PID",
        help="stop once process PID, which started this one, exits (the worker `serve` starts)",
    )
    w.set_defaults(func=cmd_worker)

    d = sub.add_parser("db", help="manage the catalog schema")
    dsub = d.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    for name, text, default in (
        ("upgrade", "apply migrations up to a revision", "head"),
        ("downgrade", "revert migrations down to a revision (`base` drops the catalog)", None),
        ("current", "show the current and head revisions", None),
    ):
        a = dsub.add_parser(name, help=text)
        if name == "downgrade":  # no default: a bare downgrade must not empty the catalog
            a.add_argument("revision", help="target revision, or `base` for an empty catalog")
        elif default is not None:
            a.add_argument(
                "revision", nargs="?", default=default, help=f"target (default {default})"
            )
        a.add_argument("--data-dir", default=None, help="embedded Postgres data directory")
    r = dsub.add_parser(
        "create-worker-role",
        help="create (or update) the workers' database role: reads and writes the store and "
        "work tables only (docs/operations.md)",
    )
    r.add_argument(
        "name",
        nargs="?",
        default=None,
        help="the role's name, e.g. backfill_worker (default: the user, and its password, "
        "of BACKFILL_WORKER_DATABASE_URL)",
    )
    r.add_argument(
        "--password-stdin", action="store_true", help="set its password, read from stdin"
    )
    r.add_argument("--data-dir", default=None, help="embedded Postgres data directory")
    r = dsub.add_parser(
        "create-reader-role",
        help="create a login role that may only select from the views in schema mv",
    )
    r.add_argument("role", help="the role's name (a lower-case identifier)")
    r.add_argument(
        "--password-env",
        metavar="VAR",
        default=None,
        help="an environment variable holding the role's password (default: no password)",
    )
    r.add_argument("--data-dir", default=None, help="embedded Postgres data directory")
    d.set_defaults(func=cmd_db)

    m = sub.add_parser("demo", help="start the service and run a real backfill end to end")
    m.add_argument("--port", type=int, default=0, help="port (default: any free port)")
    m.add_argument("--data-dir", default=None, help="embedded Postgres data directory")
    m.add_argument("--keep-running", action="store_true", help="keep serving after the demo")
    m.set_defaults(func=cmd_demo)

    o = sub.add_parser("openapi", help="print or write the OpenAPI document")
    o.add_argument("--output", default="-", help="file to write (default: stdout)")
    o.set_defaults(func=cmd_openapi)
    add_operator_commands(sub)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mv-backfill")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        configure_logging_from_env()
    except LogSettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
