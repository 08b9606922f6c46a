"""The value format: a block reads back only when key, layout, length and checksum all match."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from capkv.connectors._redis_store import RedisKeys
from capkv.connectors._redis_value import HEADER_SIZE, ValueCheck, check_value, pack_header
from capkv.connectors._keys import BlockKey
from tests.paged import Group, make_spec

KEY = BlockKey(1, bytes(range(16)))
LAYOUT = b"L" * 16
PAYLOAD = os.urandom(4096)


def value(key: BlockKey = KEY, layout: bytes = LAYOUT, payload: bytes = PAYLOAD) -> bytes:
    return pack_header(key, layout, payload) + payload


def test_the_header_is_128_bytes_and_a_value_reads_back() -> None:
    assert HEADER_SIZE == 128
    assert check_value(value(), KEY, LAYOUT, len(PAYLOAD)) is ValueCheck.OK


def test_absent_is_absent() -> None:
    assert check_value(None, KEY, LAYOUT, len(PAYLOAD)) is ValueCheck.ABSENT


@pytest.mark.parametrize("offset", [0, 5, 10, 12, 20, 40, 50, 56, 60, 71, 72, 100, 127, HEADER_SIZE, HEADER_SIZE + 1000, HEADER_SIZE + 4095])
def test_any_flipped_byte_is_a_miss_and_damage_outside_the_layout_fields(offset: int) -> None:
    damaged = bytearray(value())
    damaged[offset] ^= 0x01
    found = check_value(bytes(damaged), KEY, LAYOUT, len(PAYLOAD))
    assert found is not ValueCheck.OK
    if not 32 <= offset < 56:  # all but the layout fingerprint and the length
        assert found is ValueCheck.DAMAGED


@pytest.mark.parametrize("cut", [0, 1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1, HEADER_SIZE + 4095])
def test_a_truncated_value_is_damage(cut: int) -> None:
    assert check_value(value()[:cut], KEY, LAYOUT, len(PAYLOAD)) is ValueCheck.DAMAGED


def test_a_padded_value_is_damage() -> None:
    assert check_value(value() + b"\0", KEY, LAYOUT, len(PAYLOAD)) is ValueCheck.DAMAGED


def test_another_keys_value_is_damage() -> None:
    other = BlockKey(1, bytes(16))
    assert check_value(value(key=other), KEY, LAYOUT, len(PAYLOAD)) is ValueCheck.DAMAGED
    assert check_value(value(key=BlockKey(0, KEY.digest)), KEY, LAYOUT, len(PAYLOAD)) is ValueCheck.DAMAGED


def test_another_layouts_value_is_foreign_never_loaded() -> None:
    assert check_value(value(layout=b"M" * 16), KEY, LAYOUT, len(PAYLOAD)) is ValueCheck.FOREIGN
    assert check_value(value(payload=PAYLOAD[:2048]), KEY, LAYOUT, len(PAYLOAD)) is ValueCheck.FOREIGN


def test_another_format_version_is_foreign() -> None:
    newer = bytearray(value())
    struct.pack_into("<H", newer, 8, 3)
    assert check_value(bytes(newer), KEY, LAYOUT, len(PAYLOAD)) is ValueCheck.FOREIGN


def test_a_version_1_value_is_foreign_never_misread() -> None:
    """What capkv wrote before XXH3: a 64-byte header with a CRC-32. Someone else's now: a miss."""
    import zlib

    old = struct.pack("<8sHHI16s16sQII", b"CAPKVRB\x00", 1, 0, KEY.group, KEY.digest, LAYOUT, len(PAYLOAD),
                      zlib.crc32(PAYLOAD), 0) + PAYLOAD
    assert check_value(old, KEY, LAYOUT, len(PAYLOAD)) is ValueCheck.FOREIGN
    assert check_value(old, KEY, LAYOUT, len(old) - HEADER_SIZE) is ValueCheck.FOREIGN


def test_key_names_carry_namespace_layout_group_digest() -> None:
    layouts = (b"\x01" * 16, b"\x02" * 16)
    name = RedisKeys("llama-3", layouts)(KEY)
    namespace, rest = name.decode().split(":", 2)[1:]
    layout, group, digest = rest.split(":")
    assert namespace == "llama-3" and layout == "02" * 8 and group == "g1" and digest == KEY.digest.hex()
    assert RedisKeys("llama-3", (b"\x01" * 16, b"\x03" * 16))(KEY) != name  # another memory layout
    assert RedisKeys("other", layouts)(KEY) != name


def test_a_namespace_cannot_pin_every_key_to_one_cluster_slot() -> None:
    name = RedisKeys("a{b}:c", (b"\x01" * 16,))(BlockKey(0, KEY.digest))
    assert b"{" not in name and b"}" not in name and name.startswith(b"capkv:a%7Bb%7D%3Ac:")


def test_every_memory_layout_has_its_own_fingerprint() -> None:
    from capkv.connectors._redis_store import layout_fingerprints
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


def _two_top_bits(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[HEADER_SIZE + 3 * 8 + 7] ^= 0x80
    damaged[HEADER_SIZE + 17 * 8 + 7] ^= 0x80
    return bytes(damaged)


def _one_bit(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[HEADER_SIZE + 100] ^= 0x40
    return bytes(damaged)


OTHER = BlockKey(1, bytes(range(16, 32)))
CHECKSUM_AT = 56
"""Where a header's checksum starts (the key, layout and length come before it)."""
OTHER_PAYLOAD = bytes(reversed(PAYLOAD))


@pytest.mark.parametrize(
    ("pattern", "damage"),
    [
        ("one-bit", _one_bit),
        ("two-bit", _two_top_bits),
        ("truncated", lambda data: data[: HEADER_SIZE + len(PAYLOAD) // 2]),
        ("swapped", lambda data: value(key=OTHER, payload=OTHER_PAYLOAD)),  # another key's value under this key
        # This key's header, another value's checksum and payload: intact bytes, the wrong block.
        ("spliced", lambda data: data[:CHECKSUM_AT] + value(key=OTHER, payload=OTHER_PAYLOAD)[CHECKSUM_AT:]),
        ("foreign", lambda data: value(layout=b"M" * 16)),
    ],
)
def test_no_damage_pattern_reads_back(pattern: str, damage: Callable[[bytes], bytes]) -> None:
    damaged = damage(value())
    assert damaged != value()
    found = check_value(damaged, KEY, LAYOUT, len(PAYLOAD))
    assert found is (ValueCheck.FOREIGN if pattern == "foreign" else ValueCheck.DAMAGED), pattern
