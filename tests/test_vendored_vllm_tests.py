"""vLLM's own tests under tests/v1 are vendored unchanged (their assertions are vLLM's, not capkv's)."""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "v1"
VENDORED = {
    "kv_connector/unit/test_multi_connector.py": "7bc42b5f395625c7c0e0f764603baf181b834e4205c436335fc83f361736147b",
    "kv_connector/unit/utils.py": "7ec9051f3b04868c6f1c5a8052b85f9b7b51e6ddb3eaa25dbfdc1350ce664a82",
    "kv_connector/unit/conftest.py": "1608eabf3bb974279dac2add204cde3175f5d3df265adc6c66b32b0708993714",
}


def test_vllms_tests_are_vendored_unchanged() -> None:
    for path, digest in VENDORED.items():
        data = (ROOT / path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, f"tests/v1/{path} differs from vLLM 0.32.0's"
        assert data.startswith(b"# SPDX-License-Identifier: Apache-2.0\n"), path
    readme = (ROOT / "README.md").read_text()
    for path, digest in VENDORED.items():
        assert path in readme and digest in readme
    assert "Apache License" in (ROOT / "LICENSE").read_text()
