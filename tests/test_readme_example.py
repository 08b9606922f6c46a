"""The README's first example is true: the types and the run-time refusal it shows are what capkv gives."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

MY_CONNECTORS = textwrap.dedent(
    """\
    from typing import Any

    from capkv import BlockIds, KVConnectorBase, KVTransferParams, Request


    class _Quiet(KVConnectorBase[Request]):
        def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
            return 0, False

        def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None: ...
        def build_connector_meta(self, scheduler_output: Any, /) -> object: return None
        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
        def wait_for_layer_load(self, layer_name: str, /) -> None: ...
        def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...
        def wait_for_save(self) -> None: ...


    class OffloadConnector(_Quiet):
        def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
            return False, None


    class DiskConnector(_Quiet):
        pass
    """
)


def section(title: str) -> str:
    start = README.index(title)
    return README[start : README.index("\n## ", start + 1)]


def blocks(text: str, language: str | None = None) -> list[str]:
    """The fenced blocks of ``text``, in order (of one language, if given)."""
    found = re.findall(r"^```(\w*)\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)
    return [body for lang, body in found if language is None or lang == language]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("readme")
    (folder / "my_connectors.py").write_text(MY_CONNECTORS)
    (folder / "example.py").write_text(blocks(section("## A stack, and what the type checker says"), "python")[0])
    return folder


def test_mypy_says_what_the_readme_shows(example: Path) -> None:
    shown = [line for line in blocks(section("## A stack, and what the type checker says"))[1].splitlines() if line]
    assert shown[0].startswith("example.py:12: error")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--config-file", "", "--hide-error-context",
         "--no-error-summary", "example.py"],
        cwd=example, capture_output=True, text=True, timeout=300, check=False,
        env={"PYTHONPATH": f"{ROOT}:{example}", "PATH": "/usr/bin:/bin"},
    )
    assert done.stdout.splitlines() == shown, done.stdout + done.stderr


def test_at_run_time_check_stack_refuses_as_shown(example: Path) -> None:
    code = (example / "example.py").read_text()
    runnable = code.replace("bad.request_finished_all_groups", "hasattr(bad, 'request_finished_all_groups') and 1/0")
    done = subprocess.run(
        [sys.executable, "-c", runnable], cwd=example, capture_output=True, text=True, timeout=120, check=False,
        env={"PYTHONPATH": f"{ROOT}:{example}", "PATH": "/usr/bin:/bin"},
    )
    comment = [line.removeprefix("# ").strip() for line in code.splitlines() if line.startswith("# ")]
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == " ".join(comment), done.stderr


def test_the_same_object_twice_is_refused() -> None:
    from capkv import ConfigError, MultiConnector
    from capkv.testing import HMANullConnector

    connector = HMANullConnector()
    with pytest.raises(ConfigError, match="is the same object as #1"):
        MultiConnector(connector, connector)
