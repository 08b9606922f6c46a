"""Try the newest vLLM on the package index the CPU way, and say what capkv meets there (not part of CI).

    python -m tests.v1.newest [--venv DIR] [--release X.Y.Z]

Asks the index for vLLM's newest release (its wheel's and sdist's SHA-256 with it), builds a
virtual environment with torch 2.13.0's CPU wheel and that release's wheel without its GPU stack
(:mod:`tests.v1.wheel_env`; a venv that already has the release is reused), puts the release's
own MultiConnector tests in place from its sdist, and prints: the members of vLLM's connector
base capkv does not know, the tests passed by capkv's drop-in beside vLLM's own MultiConnector,
and stubtest's differences against stubs/vllm. docs/vllm.md ("Trying the newest vLLM") says what
a maintainer does with them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from packaging.version import Version

from tests.v1 import fetch

ROOT = Path(__file__).resolve().parents[2]
INDEX = "https://pypi.org/simple/vllm/"
TIMEOUT_SECONDS = 3600
DEPS = ("torch==2.13.0", "packaging", "mypy==2.4.1", "pytest", "hypothesis", "numpy", "typing-extensions>=4.12",
        "beartype>=0.19", "xxhash>=3.4", "redis[hiredis]>=5")
"""What capkv's tests need beside vLLM (torch: the CPU wheel, held while vLLM's requirements install)."""


def newest(release: str | None) -> tuple[str, dict[str, str]]:
    """The newest release (or ``release``) with an x86_64 wheel and an sdist, and their filenames' digests."""
    request = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 (a fixed https URL)
        files = json.load(response)["files"]
    found: dict[str, dict[str, str]] = {}
    for file in files:
        match = re.fullmatch(r"vllm-([0-9][^-]*?)(?:-cp38-abi3-manylinux_2_28_x86_64\.whl|\.tar\.gz)", file["filename"])
        if match and not file.get("yanked"):
            found.setdefault(match.group(1), {})[file["filename"]] = f"{file['url']}#{file['hashes']['sha256']}"
    complete = {v: f for v, f in found.items() if len(f) == 2 and not Version(v).is_prerelease}
    chosen = release or max(complete, key=Version)
    return chosen, complete[chosen]


def _run(python: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    proc = subprocess.run([str(python), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_SECONDS, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def environment(venv: Path, release: str, wheel_sha256: str) -> Path:
    python = venv / "bin" / "python"
    if python.exists():
        has = _run(python, "-c", "from importlib.metadata import version; print(version('vllm'))", check=False)
        if has.strip().endswith(release):
            return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=TIMEOUT_SECONDS)
    _run(python, "-m", "pip", "install", "--quiet", *DEPS)
    _run(python, "-m", "tests.v1.wheel_env", release, "--wheel-sha256", wheel_sha256)
    return python


def passed(output: str) -> str:
    """pytest's closing counts."""
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return lines[-1].strip("= ") if lines else "no result: " + output[-300:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, help="the virtual environment to build or reuse")
    parser.add_argument("--release", help="this release instead of the newest")
    args = parser.parse_args(argv)
    release, files = newest(args.release)
    wheel = next(url for name, url in files.items() if name.endswith(".whl"))
    sdist = next(url for name, url in files.items() if name.endswith(".tar.gz"))
    print(f"vLLM {release}: the newest release on the index" if not args.release else f"vLLM {release}")
    venv = args.venv or Path(os.environ.get("CAPKV_CACHE", Path.home() / ".cache" / "capkv")) / f"venv-vllm-{release}"
    python = environment(venv, release, wheel.rpartition("#")[2])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", fetch.UNPINNED_ENV: release}
    if release in fetch.RELEASES:
        _run(python, "-m", "tests.v1.fetch", "--release", release, env=env)
    else:
        url, _, digest = sdist.partition("#")
        candidate = fetch.unpinned(release, url, digest)
        fetch.extract(candidate, fetch.sdist(candidate, None))
    unknown = _run(python, "-c", "from capkv.adapters.vllm._members import unknown_members as u; print(', '.join(u()) or 'none')",
                   env=env).strip().splitlines()[-1]
    print(f"members capkv does not know: {unknown}")
    tests = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/v1/kv_connector")
    drop_in = passed(_run(python, *tests, env=env, check=False))
    own = passed(_run(python, *tests, env={**env, "CAPKV_VLLM_MULTI": "vllm"}, check=False))
    print(f"vLLM {release}'s own test_multi_connector.py: capkv's drop-in {drop_in}; vLLM's MultiConnector {own}")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "stubtest.ini"
        config.write_text("[mypy]\npython_version = 3.11\n")
        stubtest = _run(python, "-m", "mypy.stubtest", "--mypy-config-file", str(config), "--ignore-missing-stub",
                        "--allowlist", str(ROOT / "stubs" / "stubtest-allowlist.txt"), "vllm",
                        env={**env, "MYPYPATH": str(ROOT / "stubs")}, check=False)
    differences = [line for line in stubtest.splitlines() if line.startswith("error: ")]
    print(f"stubtest against stubs/vllm (the allowlist every release needs): {len(differences)} difference(s)")
    for line in differences:
        print("  " + line.removeprefix("error: "))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
