"""What a profile's ``plugin.discovery`` matches, and the device IDs it gives: ONE definition.

The agent applies these rules to the host's /sys and /dev (``patchbay_agent.discovery``);
``kubectl patchbay diff`` and ``why`` apply them to a node's NodeInventory, to say before a change
is applied what it will match there. Pure, standard library only (this package's rule).

- ``paths``: a glob matches host paths as Python's ``glob.glob`` does (the agent's own): one path
  component per pattern component, ``*`` never crossing "/", a name starting with "." matched only
  by a pattern component starting with "."; a match's ID is its path below /dev with "/" as "_"
  (``path_id``). ``glob_matches`` is that rule for one path (a unit test holds it against
  ``glob.glob`` on a tree).
- ``pci``: the vendor equal, the device equal when given, the class a prefix of the function's
  (``0x0302`` matches ``030200``); sysfs's ``0x10de`` and the inventory's ``10de`` read alike
  (``hex_value``). The ID is the PCI address.
- ``usb``: idVendor equal, idProduct and serial equal when given; the ID is ``usb-<port path>``.
- ``nvml``: every GPU NVML sees; the ID is its UUID.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from fnmatch import fnmatchcase

MAX_DEVICE_ID_LENGTH = 63
"""The longest device ID the kubelet accepts in a ListAndWatch response (docs/facts.md#device-plugin-api)."""

_ID_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")
_MAGIC = re.compile(r"[*?[]")

Read = Callable[[str], "str | None"]
"""An attribute of one device by its sysfs name (``vendor``, ``idProduct``), None when absent."""


def device_id(raw: str, max_len: int = MAX_DEVICE_ID_LENGTH) -> str:
    """A kubelet-safe device ID: allowed characters only, at most ``max_len``, still unique.

    Long names keep a readable prefix and gain a short hash of the full name, so two long paths
    that share a prefix never collide.
    """
    cleaned = _ID_BAD_CHARS.sub("_", raw).strip("_") or "device"
    if len(cleaned) <= max_len:
        return cleaned
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{cleaned[: max_len - 9]}-{digest}"


def path_id(host_path: str) -> str:
    """A ``paths`` glob match's ID: ``/dev/ttyUSB0`` is ``ttyUSB0``, ``/dev/serial/by-id/x`` is
    ``serial_by-id_x``."""
    return device_id(host_path.removeprefix("/dev/").replace("/", "_"))


def usb_id(port: str) -> str:
    """A ``usb`` device's ID from its port path (``1-1.2``): the same across re-plugs."""
    return device_id(f"usb-{port}")


def has_magic(pattern: str) -> bool:
    return _MAGIC.search(pattern) is not None


def glob_matches(pattern: str, path: str) -> bool:
    """Whether ``glob.glob(pattern)`` would return ``path`` (both host paths), were it there."""
    want = [p for p in pattern.split("/") if p]
    have = [p for p in path.split("/") if p]
    if len(want) != len(have):
        return False
    for pat, name in zip(want, have, strict=True):
        if not has_magic(pat):
            if pat != name:
                return False
        elif (name.startswith(".") and not pat.startswith(".")) or not fnmatchcase(name, pat):
            return False
    return True


def hex_value(value: str | None) -> str | None:
    """A sysfs or inventory ID as compared: lower case, without ``0x``."""
    return None if value is None else value.lower().removeprefix("0x")


def pci_matches(vendor: str, device: str | None, device_class: str | None, read: Read) -> bool:
    """Whether a PCI function (its attributes by ``read``: ``vendor``, ``device``, ``class``)
    passes a ``pci`` filter (its values as the agent's config holds them: lower case)."""
    if hex_value(read("vendor")) != vendor:
        return False
    if device is not None and hex_value(read("device")) != device:
        return False
    if device_class is not None:
        cls = hex_value(read("class"))
        if cls is None or not cls.startswith(device_class.removeprefix("0x")):
            return False
    return True


def usb_matches(vendor: str, product: str | None, serial: str | None, read: Read) -> bool:
    """Whether a USB device (``idVendor``, ``idProduct``, ``serial`` by ``read``) passes a ``usb``
    filter (vendor and product lower case, as the agent's config holds them)."""
    found = read("idVendor")
    if found is None or found.lower() != vendor:
        return False
    if product is not None:
        found = read("idProduct")
        if found is None or found.lower() != product:
            return False
    return serial is None or read("serial") == serial
