from pathlib import Path

import yaml

from service.api.openapi import openapi_document

ROOT = Path(__file__).resolve().parents[2]


def test_committed_openapi_matches_the_app() -> None:
    committed = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    assert committed == openapi_document(), "openapi.yaml is stale: run `make openapi`"
