"""Run ``capkv check`` on a configuration written to a file, as a user would: its status and output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capkv.cli._main import main


def check(
    tmp_path: Path, config: object, *options: str, capsys: pytest.CaptureFixture[str], name: str = "kv_transfer_config.json"
) -> tuple[int, str, str]:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    status = main(["check", str(path), *options])
    out, err = capsys.readouterr()
    return status, out, err
