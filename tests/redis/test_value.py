"""Redis key names, the layout fingerprint, the package import, the options (the value format: tests/stores)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from capkv.connectors._redis_store import RedisKeys
from capkv.stores import StoreKey
from capkv.stores._keys import BlockKey
from tests.paged import Group, make_spec

KEY = BlockKey(1, bytes(range(16)))


def _key(layout: bytes, key: BlockKey = KEY) -> StoreKey:
    return StoreKey(key, layout, 64 + 4096)


def test_key_names_carry_namespace_layout_group_digest() -> None:
    name = RedisKeys("llama-3")(_key(b"\x02" * 16))
    namespace, rest = name.decode().split(":", 2)[1:]
    layout, group, digest = rest.split(":")
    assert namespace == "llama-3" and layout == "02" * 16 and group == "g1" and digest == KEY.digest.hex()
    assert RedisKeys("llama-3")(_key(b"\x03" * 16)) != name  # another memory layout (or shard)
    assert RedisKeys("other")(_key(b"\x02" * 16)) != name


def test_a_namespace_cannot_pin_every_key_to_one_cluster_slot() -> None:
    name = RedisKeys("a{b}:c")(_key(b"\x01" * 16, BlockKey(0, KEY.digest)))
    assert b"{" not in name and b"}" not in name and name.startswith(b"capkv:a%7Bb%7D%3Ac:")


def test_every_memory_layout_has_its_own_fingerprint() -> None:
    from capkv.stores._fingerprint import layout_fingerprints
    from capkv.transfer import BlockCopier
    from tests.paged import LAYOUTS, empty_caches

    seen: dict[bytes, str] = {}
    for layout in LAYOUTS:
        spec = make_spec([Group(16)], layout=layout)
        copier = BlockCopier(spec, empty_caches(spec, layout, "cpu"))
        (fingerprint,) = layout_fingerprints(spec, copier)
        assert fingerprint not in seen, (layout, seen.get(fingerprint))
        seen[fingerprint] = layout


def test_importing_capkv_does_not_import_redis() -> None:
    code = (
        "import sys, capkv, capkv.connectors, capkv.config, capkv.cli._demo\n"
        "from capkv.config._registry import resolve_connector\n"
        "resolve_connector('redis')\n"
        "print('redis' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_without_the_redis_package_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from capkv.connectors import RedisStoreConnector

    monkeypatch.setitem(sys.modules, "redis", None)  # what an environment without the package looks like
    with pytest.raises(ImportError, match=r"capkv\[redis\]"):
        RedisStoreConnector(make_spec([Group(16)]), url="redis://127.0.0.1:1")


@pytest.mark.parametrize(
    ("options", "value"),
    [
        ({"url": "http://127.0.0.1:6379"}, "http://127.0.0.1:6379"),
        ({"url": "redis://127.0.0.1:6379,ftp://x"}, "redis://127.0.0.1:6379,ftp://x"),
        ({"timeout_s": 0.0}, 0.0),
        ({"timeout_s": float("inf")}, float("inf")),
        ({"retry_interval_s": -1.0}, -1.0),
        ({"url": ""}, ""),
    ],
)
def test_bad_options_are_config_errors_naming_the_connector(options: dict[str, object], value: object) -> None:
    pytest.importorskip("redis", reason="the 'redis' package is not installed (pip install 'capkv[redis]')")
    from capkv import ConfigError
    from capkv.connectors import RedisStoreConnector

    with pytest.raises(ConfigError) as caught:
        RedisStoreConnector(make_spec([Group(16)]), **options)  # type: ignore[arg-type]
    error = caught.value
    assert (error.connector, error.method, error.value) == ("RedisStoreConnector", "__init__", value)
    assert "RedisStoreConnector" in str(error)


@pytest.mark.parametrize("options", [{"namespace": 3}, {"cluster": "yes"}, {"url": None}])
def test_wrongly_typed_options_are_refused_by_name(options: dict[str, object]) -> None:
    """Production checks (ArgumentError) or, in dev mode, the type contract (ContractError): never a late failure."""
    from capkv import CapkvError
    from capkv.connectors import RedisStoreConnector

    with pytest.raises(CapkvError, match=rf"{next(iter(options))}"):
        RedisStoreConnector(make_spec([Group(16)]), **options)  # type: ignore[arg-type]
