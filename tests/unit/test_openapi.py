from pathlib import Path

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
