import re
from pathlib import Path
from typing import Any

import yaml

from service.api.openapi import openapi_document

ROOT = Path(__file__).resolve().parents[2]


def test_committed_openapi_matches_the_app() -> None:
    committed = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    assert committed == openapi_document(), "openapi.yaml is stale: run `make openapi`"


def test_error_responses_are_documented_with_the_error_shape() -> None:
    doc = openapi_document()
    assert "ErrorResponse" in doc["components"]["schemas"]
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    create = doc["paths"]["/v1/tables"]["post"]["responses"]
    assert create["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")


OPERATION_ID = re.compile(r"^[a-z][a-zA-Z]+$")
# the user-facing operation ids: a generated client's method names, so renaming one is a
# breaking change that should show in a review as an edit of this list
PUBLIC_OPERATIONS = {
    ("GET", "/healthz"): "getHealth",
    ("GET", "/readyz"): "getReadiness",
    ("GET", "/metrics"): "getMetrics",
    ("GET", "/v1/workers"): "listWorkers",
    ("POST", "/v1/tables"): "createTable",
    ("GET", "/v1/tables"): "listTables",
    ("GET", "/v1/tables/{name}"): "getTable",
    ("DELETE", "/v1/tables/{name}"): "dropTable",
    ("POST", "/v1/tables/{name}/dml"): "applyTableDml",
    ("GET", "/v1/tables/{name}/rows"): "readTableRows",
    ("GET", "/v1/tables/{name}/changes"): "streamTableChanges",
    ("POST", "/v1/sources"): "createSource",
    ("GET", "/v1/sources"): "listSources",
    ("GET", "/v1/sources/{name}"): "getSource",
    ("DELETE", "/v1/sources/{name}"): "dropSource",
    ("POST", "/v1/jobs"): "createJob",
    ("GET", "/v1/jobs"): "listJobs",
    ("GET", "/v1/jobs/{job_id}"): "getJob",
    ("PATCH", "/v1/jobs/{job_id}"): "updateJob",
    ("DELETE", "/v1/jobs/{job_id}"): "dropJob",
    ("GET", "/v1/jobs/{job_id}/progress"): "getJobProgress",
    ("POST", "/v1/jobs/{job_id}/pause"): "pauseJob",
    ("POST", "/v1/jobs/{job_id}/resume"): "resumeJob",
    ("POST", "/v1/jobs/{job_id}/retry"): "retryJob",
    ("GET", "/v1/jobs/{job_id}/verify"): "verifyJob",
    ("POST", "/v1/tables/{name}/exports"): "createExport",
    ("GET", "/v1/exports"): "listExports",
    ("GET", "/v1/exports/{export_id}"): "getExport",
    ("DELETE", "/v1/exports/{export_id}"): "cancelExport",
    ("POST", "/v1/tables/{name}/imports"): "createImport",
    ("GET", "/v1/imports"): "listImports",
    ("GET", "/v1/imports/{import_id}"): "getImport",
    ("DELETE", "/v1/imports/{import_id}"): "cancelImport",
    ("GET", "/v1/events"): "streamEvents",
    ("GET", "/v1/jobs/{job_id}/events"): "streamJobEvents",
}


def _operations() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): op
        for path, ops in openapi_document()["paths"].items()
        for method, op in ops.items()
    }


def test_operation_ids_are_short_unique_and_explicit() -> None:
    ops = _operations()
    ids = [op.get("operationId", "") for op in ops.values()]
    # FastAPI's generated ids (`create_job_v1_jobs_post`) have underscores: a route
    # without an explicit operation_id fails here
    assert [i for i in ids if not OPERATION_ID.fullmatch(i)] == []
    assert len(set(ids)) == len(ids), sorted(i for i in ids if ids.count(i) > 1)


def test_the_user_facing_operation_ids_are_the_published_ones() -> None:
    public = {
        key: op["operationId"] for key, op in _operations().items() if not _worker_route(*key)
    }
    assert public == PUBLIC_OPERATIONS


def test_the_worker_protocol_and_only_it_is_internal() -> None:
    for (method, path), op in _operations().items():
        is_worker_route = _worker_route(method, path)
        internal = "internal" in op.get("tags", []) or op.get("x-internal") is not None
        assert internal == is_worker_route, (method, path)
        if is_worker_route:
            assert op["tags"] == ["internal"] and op["x-internal"] is True, (method, path)
        else:
            assert len(op.get("tags", [])) == 1, (method, path)  # one resource group each


def test_every_tag_is_declared() -> None:
    doc = openapi_document()
    declared = [t["name"] for t in doc["tags"]]
    used = {t for ops in doc["paths"].values() for op in ops.values() for t in op["tags"]}
    assert used == set(declared) and len(declared) == len(set(declared))


def _worker_route(method: str, path: str) -> bool:
    """The worker protocol's routes (``GET /v1/workers``, the list, is the operators')."""
    return path.startswith("/v1/workers/") or (path == "/v1/workers" and method != "GET")
