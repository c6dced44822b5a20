"""Which package may import which: the worker stands on the shared packages only, never on
the control plane, and the shared packages (core, store, connectors) on neither side.
Inside the control plane the layers run downwards: routes (``service/api``), use cases
(``service/usecases``), the meta (``service/meta``), the catalog's storage
(``service/catalog``). And no module uses another module's private (``_name``) name.
(``docs/architecture.md#layout-and-layers``.)

Every import counts, at module level or inside a function (a lazy import is still a
dependency), and so does ``importlib.import_module`` / ``__import__`` of a literal name.
"""

import ast
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# package -> the top-level packages it must not import
FORBIDDEN: dict[str, frozenset[str]] = {
    "spark_workers": frozenset({"service"}),
    "backfill_core": frozenset({"service", "spark_workers"}),
    "state_store": frozenset({"service", "spark_workers"}),
    "connectors": frozenset({"service", "spark_workers"}),
}
DYNAMIC_IMPORTS = frozenset({"import_module", "__import__"})
# a layer of the control plane -> the modules (and their submodules) it must not import
LAYERS: dict[str, tuple[str, ...]] = {
    "service/catalog": ("service.meta", "service.usecases", "service.api"),
    "service/meta": ("service.usecases", "service.api"),
    "service/usecases": ("service.api",),
}
PROJECT = ("service", "spark_workers", "state_store", "connectors", "backfill_core")


def imported_packages(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import anywhere in ``source``."""
    tops = [(line, name.split(".")[0]) for line, name in imported_modules(source, None, filename)]
    return list(dict.fromkeys(tops))


def _imports_of(
    folder: str,
    imports: Callable[[Path], list[tuple[int, str]]],
    forbidden: Callable[[str], bool],
) -> list[str]:
    """``file:line imports name`` for every import of the modules under ``folder`` that
    ``forbidden`` holds."""
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"{folder} has modules"
    return [
        f"{f.relative_to(ROOT)}:{line} imports {name}"
        for f in files
        for line, name in imports(f)
        if forbidden(name)
    ]


def violations(package: str) -> list[str]:
    return _imports_of(
        package,
        lambda f: imported_packages(f.read_text(), str(f)),
        lambda name: name in FORBIDDEN[package],
    )


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _absolute(node: ast.ImportFrom, module: str | None) -> str | None:
    """The module a ``from`` import names, relative ones resolved against ``module``."""
    if node.level == 0:
        return node.module
    if module is None:
        return None
    base = module.split(".")[: -node.level]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(
    source: str, module: str | None = None, filename: str = "<string>"
) -> list[tuple[int, str]]:
    """(line, dotted name) of everything ``source`` imports: ``from a.b import c`` counts as
    ``a.b.c`` (``c`` may be a submodule); relative imports resolve against ``module``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (base := _absolute(node, module)):
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            arg = node.args[0]
            if name in DYNAMIC_IMPORTS and isinstance(arg, ast.Constant):
                found.append((node.lineno, str(arg.value)))
    return found


def layer_violations(layer: str) -> list[str]:
    return _imports_of(
        layer,
        lambda f: imported_modules(f.read_text(), module_name(f), str(f)),
        lambda name: any(name == x or name.startswith(x + ".") for x in LAYERS[layer]),
    )


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str, module: str) -> list[tuple[int, str]]:
    """(line, what) of every private name of another project module ``source`` uses:
    imported by name, or read as an attribute of an imported module or name."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    imported: dict[str, str] = {}  # local name -> what it is in its module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node, module)
            if not base or base.split(".")[0] not in PROJECT:
                continue
            for alias in node.names:
                if _private(alias.name):
                    found.append((node.lineno, f"{base}.{alias.name}"))
                imported[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    local = alias.asname or alias.name.split(".")[0]
                    imported[local] = alias.name if alias.asname else local
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
        ):
            found.append((node.lineno, f"{imported[node.value.id]}.{node.attr}"))
    return sorted(found)


def private_violations() -> list[str]:
    files = sorted(f for p in PROJECT for f in (ROOT / p).rglob("*.py"))
    return [
        f"{f.relative_to(ROOT)}:{line} uses {name}"
        for f in files
        for line, name in private_uses(f.read_text(), module_name(f))
    ]


def test_the_worker_imports_nothing_from_the_control_plane() -> None:
    assert violations("spark_workers") == []


def test_the_shared_packages_import_neither_side() -> None:
    offenders = [v for p in ("backfill_core", "state_store", "connectors") for v in violations(p)]
    assert offenders == []


def test_the_checker_sees_every_kind_of_import() -> None:
    source = (
        "import os\n"
        "import service.db as db\n"
        "from service.settings import Settings\n"
        "from . import sibling\n"
        "def f():\n"
        "    from spark_workers.runtime import Worker\n"
        "    import importlib\n"
        "    return importlib.import_module('service.meta.sources')\n"
        "def g():\n"
        "    return __import__('connectors.kafka')\n"
    )
    assert imported_packages(source) == [
        (1, "os"),
        (2, "service"),
        (3, "service"),
        (6, "spark_workers"),
        (7, "importlib"),
        (8, "service"),
        (10, "connectors"),
    ]


def test_the_catalog_is_storage_below_the_meta_and_the_use_cases() -> None:
    assert layer_violations("service/catalog") == []


def test_the_meta_imports_neither_the_use_cases_nor_the_routes() -> None:
    assert layer_violations("service/meta") == []


def test_the_use_cases_import_no_route() -> None:
    assert layer_violations("service/usecases") == []


def test_no_module_uses_another_modules_private_names() -> None:
    assert private_violations() == []


def test_the_layer_checker_sees_every_kind_of_import() -> None:
    source = (
        "import service.meta.barriers\n"
        "from service import usecases\n"
        "from service.api.jobs import router\n"
        "from ..meta import epochs\n"
        "def f():\n"
        "    import importlib\n"
        "    return importlib.import_module('service.meta.sources')\n"
    )
    assert imported_modules(source, "service.catalog.tables") == [
        (1, "service.meta.barriers"),
        (2, "service.usecases"),
        (3, "service.api.jobs.router"),
        (4, "service.meta.epochs"),
        (6, "importlib"),
        (7, "service.meta.sources"),
    ]


def test_the_private_name_checker_sees_imports_and_attributes() -> None:
    source = (
        "from service.catalog.tables import _get as get_relation, storage_of\n"
        "from .datasource import _fence\n"
        "from service.meta import barriers\n"
        "import spark_workers.datasource as ds\n"
        "import os\n"
        "from sqlalchemy import _private_ok\n"
        "barriers._pop_mutation(s, 1)\n"
        "ds._fence(cur)\n"
        "storage_of._cache\n"
        "os._exit(0)\n"
        "barriers.__name__\n"
        "def _own(): return _own\n"
    )
    assert private_uses(source, "spark_workers.kafka_datasource") == [
        (1, "service.catalog.tables._get"),
        (2, "spark_workers.datasource._fence"),
        (7, "service.meta.barriers._pop_mutation"),
        (8, "spark_workers.datasource._fence"),
        (9, "service.catalog.tables.storage_of._cache"),
    ]
