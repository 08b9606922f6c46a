"""Every public symbol of capkv has a known type (``pyright --verifytypes``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_public_api_is_fully_typed() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pyright", "--verifytypes", "capkv", "--ignoreexternal", "--outputjson"],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    report = json.loads(proc.stdout)["typeCompleteness"]
    counts = report["exportedSymbolCounts"]
    assert counts["withKnownType"] > 100, counts  # the package was found and read (about 110 public names)
    untyped = [s["name"] for s in report["symbols"] if not s["isTypeKnown"] or s.get("isTypeAmbiguous")]
    assert report["completenessScore"] == 1, untyped
    assert proc.returncode == 0, proc.stdout[-2000:]
