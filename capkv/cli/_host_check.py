"""``capkv check`` on a vLLM ``kv_transfer_config`` that names a capkv host (``capkv.vllm``).

It refuses ``CapkvHMAConnector`` over a stack that is not HMA-capable: the very refusal the host makes when
vLLM constructs it.
"""

from __future__ import annotations

from pathlib import Path

from capkv.config._hosts import HOST_MODULE, HostEntry, allowed_hosts, host_entry, require_host_capability
from capkv.config._loader import ConfiguredNode, load_stack, read_config_file
from capkv.errors import CapkvError

__all__ = ["host_lines", "host_problems", "load_hosted_file"]


def load_hosted_file(path: str | Path) -> tuple[HostEntry | None, ConfiguredNode]:
    """The file's stack — the hosted one when the file names a capkv host — and the host entry, if any."""
    data = read_config_file(path)
    entry = host_entry(data)
    return entry, load_stack(data if entry is None else entry.stack)


def host_problems(entry: HostEntry | None, configured: ConfiguredNode) -> list[str]:
    """One line when the named host may not serve the stack."""
    if entry is None:
        return []
    try:
        require_host_capability(entry.host, configured)
    except CapkvError as exc:
        return [str(exc)]
    return []


def host_lines(entry: HostEntry | None, configured: ConfiguredNode) -> list[str]:
    """The host line: the class named, and the ones the stack allows."""
    if entry is None:
        return []
    return [f"host: {HOST_MODULE}:{entry.host}; the stack allows {' or '.join(allowed_hosts(configured))}"]
