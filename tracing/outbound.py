"""Where Keel may send requests that a workspace member (or owner) configures: alert webhooks, the
Langfuse mirror, agents' tool endpoints (routing's agentic tier) and model servers (a looser rule for
those: `OutboundPolicy.for_model_servers`).

Any member who can save an alert rule chooses the URL that Keel's worker POSTs to, so without a check
that URL is a server-side request forgery: `http://127.0.0.1:5432/`, `http://169.254.169.254/` (a cloud's
metadata service, with its credentials), `http://10.0.0.7/admin`, or a name that resolves to one of them.
Keel therefore sends only to public addresses unless the operator says otherwise:

- `KEEL_OUTBOUND_ALLOW_PRIVATE=true` permits private, loopback, link-local and other non-public
  addresses (a laptop, a test, a closed network), but still not the cloud metadata addresses;
- `KEEL_OUTBOUND_ALLOWED_HOSTS` permits named hosts and networks only (`langfuse.internal,10.2.0.0/16`),
  metadata addresses included if named.

The check runs when the URL is saved (a 422 naming the field) and again for every connection: the host
is resolved once, every address it resolves to is checked, and the connection goes to a checked address,
so a name that resolved to a public address when saved and to 127.0.0.1 now (DNS rebinding) is refused,
as is a redirect to a forbidden host (each hop is a new connection, checked the same way).
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
import socket
import ssl
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx
from django.conf import settings
from django.utils.module_loading import import_string

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# A resolver takes a host name and answers its addresses as text; it raises OSError when the name does not
# resolve. `KEEL_OUTBOUND_RESOLVER` names it; the tests name a fake one (no DNS at test time).
Resolver = Callable[[str], Sequence[str]]

# Cloud metadata services: instance credentials for whoever can make the machine ask. AWS, GCP, Azure,
# OpenStack and DigitalOcean use 169.254.169.254; AWS's IPv6 one, Alibaba's, and Oracle's older one.
METADATA_ADDRESSES: frozenset[Address] = frozenset(
    ipaddress.ip_address(text) for text in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# inet_aton reads "127.1", "0x7f.0.0.1" and "2130706433" as 127.0.0.1, and so does the resolver.
_LEGACY_IPV4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.IGNORECASE)


_METADATA = "a cloud metadata address"


class AddressRefused(Exception):
    """The host is, or resolves to, an address Keel does not send to (or does not resolve at all)."""


class HostUnresolved(AddressRefused):
    """The host name does not resolve."""


def system_resolve(host: str) -> list[str]:
    """The addresses the system resolver gives for `host` (both families), in its order."""
    return list(dict.fromkeys(str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)))


def _literal(host: str) -> Address | None:
    text = host.strip("[]")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if _LEGACY_IPV4.match(text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def _unwrapped(address: Address) -> Address:
    """The IPv4 address inside an IPv4-mapped, NAT64 or 6to4 IPv6 address (each reaches that IPv4 host)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def _kind(address: Address) -> str | None:
    """Why an address is not public (None when it is)."""
    if address in METADATA_ADDRESSES:
        return _METADATA
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified:
        return "unspecified (this host)"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "not public"
    return None


@dataclass(frozen=True)
class OutboundPolicy:
    allow_private: bool = False
    allowed_hosts: frozenset[str] = frozenset()
    allowed_networks: tuple[Network, ...] = ()
    resolver: Resolver = field(default=system_resolve, compare=False)

    @classmethod
    def from_settings(cls) -> OutboundPolicy:
        hosts, networks = parse_allowed(settings.KEEL_OUTBOUND_ALLOWED_HOSTS)
        return cls(
            allow_private=settings.KEEL_OUTBOUND_ALLOW_PRIVATE,
            allowed_hosts=hosts,
            allowed_networks=networks,
            resolver=import_string(settings.KEEL_OUTBOUND_RESOLVER),
        )

    @classmethod
    def for_model_servers(cls) -> OutboundPolicy:
        """The rule for model servers (a model target's `api_base`, which litellm connects to): private and
        loopback addresses are allowed, since a model server is as often on this machine or a closed network
        (vLLM, Ollama, a Compose service) as in a cloud; a cloud's metadata service is not, unless
        KEEL_OUTBOUND_ALLOWED_HOSTS names it. Anyone who may edit a model target chooses where the gateway
        sends its requests, and a metadata service answers with the machine's credentials."""
        return dataclasses.replace(cls.from_settings(), allow_private=True)

    def _address_refusal(self, address: Address) -> str | None:
        address = _unwrapped(address)
        if any(address in network for network in self.allowed_networks):
            return None
        kind = _kind(address)
        if kind is None:
            return None
        if self.allow_private and address not in METADATA_ADDRESSES:
            return None
        return kind

    def addresses(self, host: str) -> list[str]:
        """The addresses to connect to for `host`, every one checked. Raises AddressRefused when the host
        does not resolve, or when any address it resolves to is forbidden (one bad answer of several is
        enough: the connection could go to it)."""
        name = host.strip("[]").rstrip(".").lower()
        if name in self.allowed_hosts:
            literal = _literal(name)
            return [str(literal)] if literal is not None else list(self._resolve(name))
        literal = _literal(name)
        if literal is not None:
            found: Sequence[str] = [str(literal)]
        elif name == "localhost" or name.endswith(".localhost"):
            found = ["127.0.0.1"]  # RFC 6761: always loopback, whatever a resolver says
        else:
            found = self._resolve(name)
        for text in found:
            refusal = self._address_refusal(ipaddress.ip_address(text.split("%", 1)[0]))
            if refusal is not None:
                where = text if literal is not None else f"{host} resolves to {text}, which"
                if refusal == _METADATA:
                    raise AddressRefused(
                        f"{where} is {refusal}: Keel never sends to one unless the operator names it "
                        "(KEEL_OUTBOUND_ALLOWED_HOSTS)"
                    )
                raise AddressRefused(
                    f"{where} is {refusal}: Keel sends only to public addresses unless the operator permits "
                    "others (KEEL_OUTBOUND_ALLOW_PRIVATE, KEEL_OUTBOUND_ALLOWED_HOSTS)"
                )
        return list(found)

    def _resolve(self, name: str) -> Sequence[str]:
        try:
            found = self.resolver(name)
        except (OSError, UnicodeError) as error:
            raise HostUnresolved(f"{name} does not resolve ({error})") from error
        if not found:
            raise HostUnresolved(f"{name} does not resolve")
        return found

    def url_refusal(self, url: str) -> str | None:
        """Why `url` may not be saved, or None. A name that does not resolve now is accepted (the delivery
        resolves it again, and records the error); one that resolves to a forbidden address is not."""
        try:
            host = httpx.URL(url).host
        except httpx.InvalidURL:
            return "an http(s) URL"
        if not host:
            return "an http(s) URL"
        try:
            self.addresses(host)
        except HostUnresolved:
            return None
        except AddressRefused as error:
            return str(error)
        return None


def parse_allowed(entries: Iterable[str]) -> tuple[frozenset[str], tuple[Network, ...]]:
    """`KEEL_OUTBOUND_ALLOWED_HOSTS`: host names, addresses and networks (CIDR). Raises ValueError on an
    entry that is none of them."""
    hosts: set[str] = set()
    networks: list[Network] = []
    for entry in (entry.strip().lower() for entry in entries):
        if not entry:
            continue
        if "/" in entry or _literal(entry) is not None:
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
        elif re.fullmatch(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?", entry):
            hosts.add(entry.rstrip("."))
            continue
        raise ValueError(f"KEEL_OUTBOUND_ALLOWED_HOSTS: {entry!r} is not a host name, address or network")
    return frozenset(hosts), tuple(networks)


class _CheckedBackend(httpcore.NetworkBackend):
    """httpcore's network backend with the check in front: every TCP connection (the first, each redirect's,
    each reconnect) goes to an address the policy checked, never to a name resolved again later."""

    def __init__(self, policy: OutboundPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = self._policy.addresses(host)
        last: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for address in addresses:
            try:
                return self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as error:
                last = error
        assert last is not None
        raise last

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise AddressRefused("Keel does not send to unix sockets")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class CheckedTransport(httpx.HTTPTransport):
    """An httpx transport whose connections go through `_CheckedBackend`. No proxy: a proxy would connect
    on Keel's behalf, past the check."""

    def __init__(self, policy: OutboundPolicy) -> None:
        super().__init__(verify=_ssl_context(), trust_env=False)
        # httpx builds its httpcore pool without a way to pass a network backend; this pool is the one it
        # builds by default (TLS verified, HTTP/1.1), with the checked backend.
        self._pool = httpcore.ConnectionPool(ssl_context=_ssl_context(), network_backend=_CheckedBackend(policy))


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """httpx's default TLS context (certificates verified), made once: loading the CA bundle takes tens of
    milliseconds, too long to pay for each tool call. A context is meant to be shared by connections."""
    return httpx.create_ssl_context(trust_env=False)


def checked_client(
    *, timeout: float, follow_redirects: bool = False, policy: OutboundPolicy | None = None
) -> httpx.Client:
    """An httpx client that sends only where the policy (the settings' by default) permits."""
    return httpx.Client(
        transport=CheckedTransport(policy or OutboundPolicy.from_settings()),
        timeout=timeout,
        follow_redirects=follow_redirects,
        trust_env=False,
    )
