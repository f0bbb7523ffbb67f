"""Which hosts are this machine: the one check shared by the adapters (no API key is needed for a
server on loopback) and ``dxi view`` (serving beyond loopback needs ``--host`` said aloud). Standard
library only, so that any layer may import it (``dxi.layers``)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback(url: str) -> bool:
    """True when ``url``'s host is this machine (127.0.0.0/8, ::1, localhost): no API key needed
    there."""
    return is_loopback_host(urlsplit(url).hostname or "")


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only: localhost, 127.0.0.0/8 or
    ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
