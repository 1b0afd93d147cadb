"""Socket names (one per agent process, within sun_path) and the removal of stale sockets."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest
from support.fakehw import live_socket, stale_socket

from patchbay_agent.constants import DEFAULT_DEVICE_PLUGIN_DIR
from patchbay_agent.kubelet.sockets import (
    MAX_SLUG_LENGTH,
    MAX_UNIX_SOCKET_PATH,
    check_instance,
    check_path,
    is_same_resource,
    legacy_socket_name,
    new_instance,
    probe,
    remove_stale_sockets,
    resource_slug,
    socket_name,
)

SERIAL = "example.com/serial"
#: The longest valid extended resource name: a 253-character DNS subdomain, "/", 63 characters.
LONGEST = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]) + "/" + "n" * 63


def test_socket_name_is_per_resource_and_instance() -> None:
    assert socket_name(SERIAL, "1a2b3c4d") == "patchbay-example.com_serial-1a2b3c4d.sock"
    assert socket_name("nvidia.com/gpu", "x") == "patchbay-nvidia.com_gpu-x.sock"
    assert legacy_socket_name(SERIAL) == "patchbay-example.com_serial.sock"


def test_default_instances_are_fresh_short_hex_tokens() -> None:
    drawn = {new_instance() for _ in range(1000)}
    assert len(drawn) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{8}", i) for i in drawn)


@pytest.mark.parametrize("bad", ["", "a-b", "ABC", "a" * 17, "a.b", "a/b", "a_b"])
def test_instances_that_could_blur_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="lowercase letters or digits"):
        check_instance(bad)
    with pytest.raises(ValueError, match="instance"):
        socket_name(SERIAL, bad)


def test_long_resource_names_are_shortened_with_a_hash_and_fit_sun_path() -> None:
    slug = resource_slug(LONGEST)
    assert len(slug) == MAX_SLUG_LENGTH
    assert slug == resource_slug(LONGEST)  # deterministic: old and new agents agree
    assert re.fullmatch(r"a{27}-[0-9a-f]{12}", slug)
    # Two long names with the same head differ by their hash.
    other = LONGEST[:-1] + "m"
    assert resource_slug(other) != slug
    # The longest name with the longest instance, in the kubelet's default directory.
    path = Path(DEFAULT_DEVICE_PLUGIN_DIR) / socket_name(LONGEST, "z" * 16)
    assert len(str(path).encode()) <= MAX_UNIX_SOCKET_PATH
    check_path(path)
    # A name that fits is kept readable.
    assert resource_slug("example.com/" + "x" * 28) == "example.com_" + "x" * 28


def test_a_directory_too_long_for_any_socket_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than 107 bytes"):
        check_path(Path("/" + "d" * 80) / socket_name(SERIAL, new_instance()))


def test_same_resource_matching_never_takes_another_resources_socket() -> None:
    assert is_same_resource(socket_name(SERIAL, "1a2b3c4d"), SERIAL)
    assert is_same_resource(socket_name(SERIAL, "human1"), SERIAL)
    assert is_same_resource(legacy_socket_name(SERIAL), SERIAL)
    # "example.com/serial-abcd" starts with our prefix; its instance part would contain a "-".
    for other in ("example.com/serial-abcd", "example.com/serial2", "example.com/seria", "other.com/serial"):
        assert not is_same_resource(socket_name(other, "1a2b3c4d"), SERIAL), other
        assert not is_same_resource(socket_name(SERIAL, "1a2b3c4d"), other), other
    for other in ("example.com/serial2", "example.com/seria", "other.com/serial", "example.com/serial-a-b"):
        assert not is_same_resource(legacy_socket_name(other), SERIAL), other
    # The one ambiguity: the LEGACY name of a resource ending in "-<lowercase letters/digits>" reads
    # as one of our instances. Only a stale (refused) one is ever removed, which harms nobody.
    assert is_same_resource(legacy_socket_name("example.com/serial-abcd"), SERIAL)
    assert not is_same_resource("kubelet.sock", SERIAL)
    assert not is_same_resource("patchbay-example.com_serial-1a2b3c4d.sock.tmp", SERIAL)
    long_other = LONGEST[:-1] + "m"
    assert is_same_resource(socket_name(LONGEST, "ab12"), LONGEST)
    assert not is_same_resource(socket_name(long_other, "ab12"), LONGEST)


def test_probe_tells_live_fromstale_socket(short_dir: Path) -> None:
    stale_socket(short_dir / "dead.sock")
    with live_socket(short_dir / "live.sock"):
        assert probe(short_dir / "live.sock") == 0
    assert probe(short_dir / "dead.sock") == errno.ECONNREFUSED
    assert probe(short_dir / "missing.sock") == errno.ENOENT


def test_only_stale_sockets_of_the_same_resource_are_removed(short_dir: Path) -> None:
    ours = socket_name(SERIAL, "0000aaaa")
    dead = socket_name(SERIAL, "1111bbbb")
    legacy = legacy_socket_name(SERIAL)
    live = socket_name(SERIAL, "2222cccc")
    other_dead = socket_name("example.com/serial-abcd", "3333dddd")
    other_legacy = legacy_socket_name("example.com/serial2")
    not_a_socket = socket_name(SERIAL, "4444eeee")
    for name in (ours, dead, legacy, other_dead, other_legacy):
        stale_socket(short_dir / name)
    (short_dir / not_a_socket).write_text("")
    with live_socket(short_dir / live):
        removed = remove_stale_sockets(short_dir, SERIAL, keep=ours)
        assert removed == sorted([dead, legacy])
        left = sorted(p.name for p in short_dir.iterdir())
        assert left == sorted([ours, live, other_dead, other_legacy, not_a_socket])
        # The live one is still served.
        assert probe(short_dir / live) == 0
    assert remove_stale_sockets(short_dir / "missing", SERIAL, keep=ours) == []


def test_the_agent_and_the_test_matrix_agree_on_when_the_kubelet_keeps_an_endpoint_per_socket() -> None:
    """The agent hands over in rollouts on kubelets before this minor; the matrix's capability
    (what the e2e suites expect per release) names the same one."""
    from patchbay_agent.deviceplugin.handover import ENDPOINT_PER_SOCKET_SINCE
    from patchbay_devcluster.releases import CAPABILITIES, minor

    assert minor(CAPABILITIES["device-plugin-endpoint-per-socket"].since) == ENDPOINT_PER_SOCKET_SINCE
