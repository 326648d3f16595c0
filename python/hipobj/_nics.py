"""The RDMA devices a session without a GPU may serve host memory on.

The C ABI's ``hipObjInit`` fails without a GPU unless ``nicHint`` names
NICs (the original's rule: ``hipObjRdmaError``, hipError 100). A session
that was not asked for a GPU then names them itself, as ``hipobj doctor``
and the Rust API choose: every RDMA device with an active port, read from
``sys/class/infiniband/*/ports/*/state`` the way the library's topology
reader reads it (``src/platform/topology``), passed comma-separated (the
library takes any of them, in that order, and checks each again).
"""

from __future__ import annotations

import os
from typing import List

#: ``IB_PORT_ACTIVE`` of the kernel's ``enum ib_port_state``.
_ACTIVE = 4
#: The most an attribute file holds (a page).
_MAX_ATTRIBUTE = 4096


def _read(path: str) -> str:
    """The trimmed text of a sysfs attribute; "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_ATTRIBUTE + 1)
    except OSError:
        return ""
    if len(raw) > _MAX_ATTRIBUTE:
        return ""
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return ""


def _active(state: str) -> bool:
    """``state``: ``"4: ACTIVE"`` (``"%d: %s"``): the number decides; a
    bare name is accepted too."""
    number, colon, _ = state.partition(":")
    if not colon:
        return state == "ACTIVE"
    number = number.strip()
    return number.isascii() and number.isdigit() and int(number) == _ACTIVE


def _port_number(name: str) -> bool:
    """A port directory's name: plain decimal digits, a port number (u8)."""
    return name.isascii() and name.isdigit() and int(name) <= 255


def active_devices(root: str = "/") -> List[str]:
    """The RDMA devices under `root`'s ``sys/class/infiniband`` that have
    an active port, by name; none when the directory is missing (no RDMA
    driver loaded)."""
    class_dir = os.path.join(root, "sys", "class", "infiniband")
    try:
        names = sorted(os.listdir(class_dir))
    except OSError:
        return []
    found = []
    for name in names:
        ports = os.path.join(class_dir, name, "ports")
        try:
            numbers = os.listdir(ports)
        except OSError:
            continue
        if any(_port_number(n) and _active(_read(os.path.join(ports, n, "state"))) for n in numbers):
            found.append(name)
    return found


def named_by_environment() -> bool:
    """Whether ``HIPOBJ_NIC_HINT`` names a NIC (the library then uses it
    when ``nicHint`` is NULL)."""
    return any(name.strip() for name in os.environ.get("HIPOBJ_NIC_HINT", "").split(","))
