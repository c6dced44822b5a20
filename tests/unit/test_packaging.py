"""The packages each role installs (docs/operations.md, "Installing by role", "Pinned
dependencies"): extras by role in pyproject.toml, lock files that pin every direct
dependency, and dependency sets that install on linux/arm64 as well as amd64.

No network and no Docker engine: an image builds for arm64 when every package it installs
has an aarch64 wheel or is pure Python. Which locked packages are compiled is read from the
wheels installed here (their WHEEL tags); those that are must be in AARCH64_WHEELS, each
checked once against the index (`pip download --only-binary=:all: --platform
manylinux2014_aarch64 --platform manylinux_2_28_aarch64 --python-version 3.11 --no-deps`).
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = {
    "control-plane": ROOT / "requirements" / "control-plane.lock",
    "worker": ROOT / "requirements" / "worker.lock",
}

# Compiled packages of the locks with a manylinux aarch64 wheel for CPython 3.11, checked at
# the locked versions (confluent-kafka 2.16.1, httptools 0.9.0, markupsafe 3.0.4,
# msgspec 0.23.0, psycopg2-binary 2.9.13, pyarrow 26.0.1, pydantic-core 2.50.5, pyyaml 6.0.4,
# sqlalchemy 2.1.9, uvloop 0.23.0). A new compiled dependency is checked, then added here.
AARCH64_WHEELS = frozenset(
    {
        "confluent-kafka",
        "httptools",
        "markupsafe",
        "msgspec",
        "psycopg2-binary",
        "pyarrow",
        "pydantic-core",
        "pyyaml",
        "sqlalchemy",
        "uvloop",
    }
)
# pgserver 0.1.4: a linux x86_64 wheel, no aarch64 wheel and no sdist
NO_AARCH64 = frozenset({"pgserver"})

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.M)


def project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def requirements(extra: str | None = None) -> list[Requirement]:
    p = project()
    found = p["dependencies"] if extra is None else p["optional-dependencies"][extra]  # type: ignore[index]
    return [Requirement(r) for r in found]  # type: ignore[union-attr]


def pins(role: str) -> dict[str, str]:
    return {canonicalize_name(n): v for n, v in PIN.findall(LOCKS[role].read_text())}


def role_requirements(role: str) -> list[Requirement]:
    return [*requirements(), *(requirements("worker") if role == "worker" else [])]


def is_compiled(name: str) -> bool:
    """Whether the wheel installed here is for one platform (not ``py3-none-any``)."""
    try:
        wheel = metadata.distribution(name).read_text("WHEEL") or ""
    except metadata.PackageNotFoundError:
        pytest.fail(f"{name} is locked but not installed here: `make install`")
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    assert tags, f"{name}: no WHEEL tags"
    return not all(tag.endswith("-none-any") for tag in tags)


# ---- extras by role ----------------------------------------------------------------------


def test_the_base_package_is_the_control_plane() -> None:
    base = {canonicalize_name(r.name) for r in requirements()}
    assert not base & {"pyspark", "pyarrow", "pgserver"}, "the control plane runs none of them"
    # the control plane itself reads Kafka watermarks and verifies source jobs
    assert {"fastapi", "sqlalchemy", "alembic", "confluent-kafka"} <= base


def test_the_extras_add_spark_and_the_embedded_postgres() -> None:
    assert {canonicalize_name(r.name) for r in requirements("worker")} == {"pyspark", "pyarrow"}
    assert {canonicalize_name(r.name) for r in requirements("embedded")} == {"pgserver"}
    (everything,) = requirements("all")
    assert (everything.name, everything.extras) == ("mv-backfill", {"worker", "embedded"})


# ---- lock files ----------------------------------------------------------------------------


@pytest.mark.parametrize("role", sorted(LOCKS))
def test_every_direct_dependency_is_pinned_in_its_roles_lock(role: str) -> None:
    pinned = pins(role)
    for req in role_requirements(role):
        name = canonicalize_name(req.name)
        assert name in pinned, f"{LOCKS[role].name} does not pin {req.name}: `make lock`"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{LOCKS[role].name} pins {name}=={pinned[name]}, outside {req}: `make lock`"
        )


def test_the_locks_agree_on_the_packages_they_share() -> None:
    control_plane, worker = pins("control-plane"), pins("worker")
    assert set(worker) > set(control_plane), "the worker runs the control plane's packages too"
    differ = {n: (v, worker[n]) for n, v in control_plane.items() if worker.get(n) != v}
    assert not differ, f"versions differ between the locks: {differ}"
    extra = set(worker) - set(control_plane)
    assert {"pyspark", "pyarrow"} <= extra


@pytest.mark.parametrize("role", sorted(LOCKS))
def test_locks_name_no_local_index(role: str) -> None:
    text = LOCKS[role].read_text()
    for option in ("--index-url", "--extra-index-url", "--find-links", "file://"):
        assert option not in text, f"{LOCKS[role].name} names this machine's index ({option})"


# ---- arm64 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("role", sorted(LOCKS))
def test_every_locked_package_installs_on_arm64(role: str) -> None:
    locked = pins(role)
    assert not set(locked) & NO_AARCH64, f"{role} would not build for arm64"
    compiled = {name for name in locked if is_compiled(name)}
    unchecked = compiled - AARCH64_WHEELS
    assert not unchecked, (
        f"compiled packages in {LOCKS[role].name} not checked for an aarch64 wheel: "
        f"{sorted(unchecked)} (see this module's docstring)"
    )


def test_the_arm64_check_would_catch_pgserver() -> None:
    # the check above means something: pgserver is compiled and not among the aarch64 ones
    assert is_compiled("pgserver") and "pgserver" not in AARCH64_WHEELS
    assert is_compiled("psycopg2-binary") and not is_compiled("fastapi")
