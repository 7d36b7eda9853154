"""Every Kubernetes object we ship validates against the official 1.37 schemas (strict: no unknown fields)."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(p for folder in ("manifests", "examples") for p in (ROOT / folder).rglob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_objects_pass_the_official_schemas(path):
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert documents, f"{path} holds no objects"
    for document in documents:
        kubernetes_validate.validate(document, "1.37.0", strict=True)
