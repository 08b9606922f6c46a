"""Done when (issue 12): a package outside the repo defines a connector and uses capkv as a user would.

The test writes a package in a temporary directory (``pyproject.toml`` and a
module holding the connector of docs/writing-a-connector.md), installs it with
pip into a target folder of its own (never into the shared environment), and in
subprocesses that see only that folder and capkv:

1. runs the package's own test, which calls ``capkv.testing.assert_conformant``;
2. serves it with ``capkv demo --import kvmem.connector --stack "cpu,kvmem.connector:MemStore"``;
3. ``capkv check``s a configuration naming it (``module:Class`` and ``kv_connector_module_path``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.test_guide import example_source

ROOT = Path(__file__).resolve().parents[1]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "kvmem"
version = "0.1.0"
dependencies = ["capkv"]

[tool.setuptools]
packages = ["kvmem"]
"""

OWN_TEST = '''\
from kvmem.connector import MemStore
from capkv.testing import assert_conformant


def test_memstore_conforms() -> None:
    report = assert_conformant(MemStore)
    print(report)
'''


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The package's source tree, and the environment of a process where it is installed."""
    base = tmp_path_factory.mktemp("outside")
    source = base / "kvmem-src"
    (source / "kvmem").mkdir(parents=True)
    (source / "tests").mkdir()
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "kvmem" / "__init__.py").write_text('"""An in-memory KV connector, outside capkv."""\n')
    (source / "kvmem" / "connector.py").write_text(example_source())
    (source / "tests" / "test_conformance.py").write_text(OWN_TEST)
    site = base / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    assert (site / "kvmem" / "connector.py").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("CAPKV_DEV", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    return source, env


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_its_own_tests_run_the_conformance_kit(package: tuple[Path, dict[str, str]]) -> None:
    source, env = package
    done = run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests"], source, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "capkv.testing: MemStore (HMA): 20 of 20 scenarios passed" in done.stdout
    assert "1 passed" in done.stdout


def test_capkv_demo_serves_it(package: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    _, env = package
    done = run(
        [sys.executable, "-m", "capkv", "demo", "--import", "kvmem.connector",
         "--stack", "cpu,kvmem.connector:MemStore", "--requests", "8", "--prefixes", "2"],
        tmp_path, env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "#2 MemStore" in done.stdout and "HMA: yes" in done.stdout
    assert "verified: bit-exact" in done.stdout


def test_capkv_demo_loads_through_it_alone(package: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    _, env = package
    done = run(
        [sys.executable, "-m", "capkv", "demo", "--import", "kvmem.connector",
         "--stack", "kvmem.connector:MemStore", "--requests", "8", "--prefixes", "2"],
        tmp_path, env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    warm_loaded = next(line for line in done.stdout.splitlines() if line.strip().startswith("bytes loaded"))
    assert warm_loaded.split()[-2:] != ["0", "B"], warm_loaded  # the warm run loaded through MemStore


@pytest.mark.parametrize(
    "entry",
    ['kv_connector = "kvmem.connector:MemStore"',
     'kv_connector = "MemStore"\nkv_connector_module_path = "kvmem.connector"'],
    ids=["module:Class", "kv_connector_module_path"],
)
def test_capkv_check_accepts_a_config_naming_it(package: tuple[Path, dict[str, str]], tmp_path: Path, entry: str) -> None:
    _, env = package
    config = tmp_path / "stack.toml"
    config.write_text(textwrap.dedent(
        """\
        kv_connector = "MultiConnector"

        [[kv_connector_extra_config.connectors]]
        kv_connector = "CPUOffloadConnector"
        kv_connector_extra_config = { capacity_blocks = 4096 }

        [[kv_connector_extra_config.connectors]]
        """) + entry + "\n"
    )
    done = run([sys.executable, "-m", "capkv", "check", str(config), "--groups", "3"], tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "#2 MemStore" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("ok: the stack can serve 3 KV-cache groups")


def test_capkv_check_refuses_an_option_it_does_not_declare(package: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    _, env = package
    config = tmp_path / "stack.json"
    config.write_text('{"kv_connector": "kvmem.connector:MemStore", "kv_connector_extra_config": {"capacity": 4}}')
    done = run([sys.executable, "-m", "capkv", "check", str(config), "--groups", "2"], tmp_path, env)
    assert done.returncode != 0
    assert 'unknown option "capacity"' in done.stdout + done.stderr
