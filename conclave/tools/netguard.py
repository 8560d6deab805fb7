"""The `fetch` tool's network guard: pure, synchronous URL and address policy checks.

Nothing here does I/O or DNS. The fetcher calls, before a byte is sent:

    target = parse_url(url, allow_ports=...)       # scheme, authority, numeric hosts, IDNA
    host_allowed(target.host, allow_hosts)         # fetch.allow_hosts globs
    check_address(addr, allow_private=...)         # for target.ip, or every resolved address
    target.connect_url(addr)                       # connect to the address that was checked

Every refusal is a `Blocked` whose `reason` is a fetch refusal reason of docs/tools.md#fetch.

Hosts are classified the way a WHATWG (browser) URL parser would: percent-decoded, NFKC
and UTS 46 mapped, then any host whose last label is a number is an IPv4 literal in one of
the inet_aton spellings (`127.1`, `0x7f000001`, `0177.0.0.1`, ...). A host that looks
numeric but is not a valid IPv4 address (`1.2.3.256`, `1.2.3.4.5`, `08`) is refused with
`host_not_allowed` instead of being handed to a resolver that may read it differently.
"""

from __future__ import annotations

import fnmatch
import re
import string
import unicodedata
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network
from urllib.parse import quote, unquote, unquote_to_bytes, urlsplit

import idna

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

REASONS = frozenset(
    {
        "scheme_not_allowed",
        "host_not_allowed",
        "unresolvable_host",
        "private_address",
        "metadata_address",
        "port_not_allowed",
        "too_many_redirects",
        "timeout",
        "connection_error",
        "unsupported_content_type",
        "egress_budget_exhausted",
        "breaker_open",
    }
)
ALLOWED_SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_URL_LENGTH = 8192


class Blocked(Exception):
    """A refusal. `reason` is one of the fetch refusal reasons of docs/tools.md#fetch."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown fetch refusal reason {reason!r}")
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Target:
    """A URL that passed `parse_url`: every field normalized, nothing left to reinterpret."""

    scheme: str
    host: str
    port: int
    ip: Address | None
    path: str
    userinfo: tuple[str, str] | None

    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    def url(self) -> str:
        return f"{self.scheme}://{self.host_header()}{self.path}"

    def host_header(self) -> str:
        return self._authority(self.host, bracket=self.ip is not None and self.ip.version == 6)

    def connect_url(self, address: Address) -> str:
        if isinstance(address, IPv6Address) and address.scope_id:
            raise ValueError(f"refusing to connect to a scoped address {address}")
        return f"{self.scheme}://{self._authority(str(address), bracket=address.version == 6)}{self.path}"

    def _authority(self, host: str, *, bracket: bool) -> str:
        shown = f"[{host}]" if bracket else host
        return shown if self.port == DEFAULT_PORTS[self.scheme] else f"{shown}:{self.port}"


# --- URLs -------------------------------------------------------------------------------

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_PORT = re.compile(r"[0-9]+")
_NAME_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
# Printable ASCII stays as written (so existing %xx escapes survive); anything else is UTF-8
# percent-encoded, which makes the path stable under re-parsing.
_PATH_SAFE = string.punctuation
# Characters a host may never contain after decoding; several of them end or re-split an
# authority in some other parser (WHATWG "forbidden domain code points", plus "\").
_HOST_FORBIDDEN = frozenset("#%/:<>?@[\\]^|")
# Dots that NFKC leaves alone but UTS 46 (and so browsers) treat as label separators.
_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


def parse_url(url: str, *, allow_ports: Collection[int]) -> Target:
    """Parse and normalize an http(s) URL, or raise `Blocked`. Does no I/O."""
    if len(url) > MAX_URL_LENGTH:
        raise Blocked("host_not_allowed", f"URL is longer than {MAX_URL_LENGTH} characters")
    _refuse_unsafe_characters(url)
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else ""
    if match is None or scheme not in ALLOWED_SCHEMES:
        raise Blocked("scheme_not_allowed", f"only http and https URLs are fetched, not {scheme or 'none'!r}")
    if not url[match.end() :].startswith("//"):
        raise Blocked("host_not_allowed", "URL has no '//' authority")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise Blocked("host_not_allowed", f"malformed URL: {exc}") from None
    userinfo, raw_host, raw_port = _split_authority(parts.netloc)
    host, ip = _normalize_host(raw_host)
    port = _parse_port(raw_port, scheme)
    if port not in allow_ports:
        raise Blocked("port_not_allowed", f"port {port} is not allowed")
    return Target(scheme, host, port, ip, _path_of(parts.path, parts.query), userinfo)


def _refuse_unsafe_characters(url: str) -> None:
    # urlsplit silently drops tabs and newlines and WHATWG parsers read "\" as "/", so a URL
    # containing them means different things to different parsers: refuse it outright.
    for ch in url:
        if ch == "\\" or ch.isspace() or unicodedata.category(ch) in ("Cc", "Cs", "Zs", "Zl", "Zp"):
            raise Blocked("host_not_allowed", f"URL contains a forbidden character {ch!r}")


def _split_authority(netloc: str) -> tuple[tuple[str, str] | None, str, str | None]:
    if netloc.count("@") > 1:
        raise Blocked("host_not_allowed", "more than one '@' in the URL authority")
    raw_userinfo, _, hostport = netloc.rpartition("@")
    userinfo = _parse_userinfo(raw_userinfo)
    if hostport.startswith("["):
        host, bracket, rest = hostport.partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise Blocked("host_not_allowed", f"malformed IPv6 literal in {hostport!r}")
        return userinfo, host + bracket, rest[1:] if rest else None
    if hostport.count(":") > 1:
        raise Blocked("host_not_allowed", f"unbracketed ':' in host {hostport!r}")
    host, colon, port = hostport.partition(":")
    return userinfo, host, port if colon else None


def _parse_userinfo(raw: str) -> tuple[str, str] | None:
    user, _, password = raw.partition(":")
    if not user and not password:
        return None
    return (unquote(user), unquote(password))


def _parse_port(raw: str | None, scheme: str) -> int:
    if not raw:  # absent, or empty as in "http://host:/" which WHATWG reads as the default
        return DEFAULT_PORTS[scheme]
    digits = raw.lstrip("0")
    if not _PORT.fullmatch(raw) or not digits or len(digits) > 5 or int(digits) > 65535:
        raise Blocked("host_not_allowed", f"invalid port {raw!r}")
    return int(digits)


def _path_of(path: str, query: str) -> str:
    encoded = quote(path or "/", safe=_PATH_SAFE)
    return f"{encoded}?{quote(query, safe=_PATH_SAFE)}" if query else encoded


# --- hosts ------------------------------------------------------------------------------


def _normalize_host(raw: str) -> tuple[str, Address | None]:
    if raw.startswith("["):
        ip6 = _ipv6_literal(raw[1:-1])
        return ip6.compressed, ip6
    host = _fold(_percent_decode(raw))
    if not host:
        raise Blocked("host_not_allowed", "URL has an empty host")
    _refuse_unsafe_characters(host)  # again: NFKC turns some characters into spaces
    if _HOST_FORBIDDEN.intersection(host):
        raise Blocked("host_not_allowed", f"host {host!r} contains a forbidden character")
    ip4 = _ipv4_literal(host)
    if ip4 is None:
        host = _ascii_name(host)
        ip4 = _ipv4_literal(host)  # UTS 46 mapping may have produced digits: classify again
    return (str(ip4), ip4) if ip4 is not None else (host, None)


def _percent_decode(raw: str) -> str:
    # Resolvers and proxies disagree on whether to decode "%31": decode once here and
    # classify the result, so the name we check is the name we resolve.
    if "%" not in raw:
        return raw
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise Blocked("host_not_allowed", f"host {raw!r} is not valid UTF-8 once decoded") from None


def _fold(host: str) -> str:
    # NFKC turns fullwidth digits and dots into ASCII; the translation catches the dots it
    # keeps; trailing dots name the same DNS node.
    return unicodedata.normalize("NFKC", host).translate(_DOTS).lower().rstrip(".")


def _ascii_name(host: str) -> str:
    labels = [label if label.isascii() else _idna_label(label) for label in host.split(".")]
    name = ".".join(labels)
    if len(name) > 253 or not all(_NAME_LABEL.fullmatch(label) for label in labels):
        raise Blocked("host_not_allowed", f"{host!r} is not a valid host name")
    return name


def _idna_label(label: str) -> str:
    try:
        return idna.alabel(idna.uts46_remap(label, std3_rules=True, transitional=False)).decode("ascii")
    except UnicodeError as exc:  # idna.IDNAError is a UnicodeError
        raise Blocked("host_not_allowed", f"label {label!r} is not a valid IDNA name: {exc}") from None


def parse_ip_literal(host: str) -> Address | None:
    """The IP address `host` spells, in any numeric form, or None for a DNS name.

    Raises `Blocked("host_not_allowed")` for an IPv6 zone id, a malformed bracketed literal,
    or a host that ends in a number but is not a valid IPv4 address.
    """
    if host.startswith("[") and host.endswith("]"):
        return _ipv6_literal(host[1:-1])
    folded = _fold(host)
    if ":" in folded:
        return _ipv6_literal(folded)
    return _ipv4_literal(folded)


def _ipv6_literal(text: str) -> IPv6Address:
    if "%" in text:
        raise Blocked("host_not_allowed", f"IPv6 zone ids are not allowed: {text!r}")
    if not text.isascii():
        raise Blocked("host_not_allowed", f"invalid IPv6 literal {text!r}")
    try:
        return IPv6Address(text)
    except ValueError:
        raise Blocked("host_not_allowed", f"invalid IPv6 literal {text!r}") from None


def _ipv4_literal(host: str) -> IPv4Address | None:
    # The WHATWG IPv4 parser: 1-4 parts, the last one fills the remaining bytes.
    parts = host.split(".")
    if not _ends_in_number(parts[-1]):
        return None
    numbers = [_ipv4_number(part) for part in parts]
    valid = [n for n in numbers if n is not None]
    if len(parts) > 4 or len(valid) != len(numbers):
        raise Blocked("host_not_allowed", f"{host!r} looks numeric but is not an IPv4 address")
    *head, last = valid
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        raise Blocked("host_not_allowed", f"{host!r} is an out-of-range IPv4 address")
    value = last
    for index, n in enumerate(head):
        value += n << (8 * (3 - index))
    return IPv4Address(value)


def _ends_in_number(label: str) -> bool:
    return bool(label) and ((label.isascii() and label.isdigit()) or _ipv4_number(label) is not None)


def _ipv4_number(part: str) -> int | None:
    radix, digits = 10, part
    if part[:2] in ("0x", "0X"):
        radix, digits = 16, part[2:]
    elif len(part) > 1 and part.startswith("0"):
        radix, digits = 8, part[1:]
    allowed = {10: "0123456789", 16: string.hexdigits, 8: string.octdigits}[radix]
    if not part or not all(ch in allowed for ch in digits):
        return None
    significant = digits.lstrip("0") or "0"
    # Anything this long is out of range anyway; the cap keeps int() away from huge inputs.
    return 1 << 40 if len(significant) > 16 else int(significant, radix)


# --- addresses --------------------------------------------------------------------------


def _nets(*specs: tuple[str, str]) -> tuple[tuple[Network, str], ...]:
    return tuple((ip_network(net), label) for net, label in specs)


# Refused even when fetch.allow_private covers them: these hand out credentials.
_METADATA = _nets(
    ("169.254.169.0/24", "cloud metadata service (AWS, GCP, Azure, OpenStack; AWS DNS and NTP)"),
    ("169.254.170.0/24", "cloud metadata service (AWS ECS task credentials, EKS Pod Identity)"),
    ("169.254.0.23/32", "cloud metadata service (Tencent Cloud)"),
    ("168.63.129.16/32", "cloud metadata service (Azure WireServer)"),
    ("100.100.100.200/32", "cloud metadata service (Alibaba Cloud)"),
    ("192.0.0.192/32", "cloud metadata service (Oracle Cloud)"),
    ("fd00:ec2::/64", "cloud metadata service (AWS IPv6 IMDS, DNS, NTP)"),
    ("fd20:ce::254/128", "cloud metadata service (GCP IPv6)"),
    ("fd00:c1::a9fe:a9fe/128", "cloud metadata service (Oracle Cloud IPv6)"),
)
# Explicit, because ipaddress.is_global misses some (multicast, 192.88.99/24, 64:ff9b:1::/48)
# and its tables change between Python releases.
_NON_PUBLIC = _nets(
    ("0.0.0.0/8", "unspecified ('this network')"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "carrier-grade NAT shared space"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation (TEST-NET-1)"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "documentation (TEST-NET-3)"),
    ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("::ffff:0:0:0/96", "IPv4-translated"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/23", "IETF protocol assignments (Teredo, benchmarking, ORCHID)"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "SRv6 segment identifiers"),
    ("fc00::/7", "unique local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)
# IANA allocates global unicast only from 2000::/3; the NAT64 well-known prefix is the one
# routable exception, and its embedded IPv4 is checked separately.
_V6_ROUTABLE = (IPv6Network("2000::/3"), IPv6Network("64:ff9b::/96"))


def check_address(address: Address, *, allow_private: Sequence[Network] = ()) -> None:
    """Refuse `address` unless it is public or inside `allow_private`; metadata always.

    An IPv4-mapped address is checked as the IPv4 address it is. Other IPv6 forms that embed
    IPv4 (compatible, translated, 6to4, NAT64, Teredo server and client, ISATAP) are refused
    when either the IPv6 address or any embedded IPv4 address is refused.
    """
    views = list(_views(address))
    for ip, via in views:
        if label := _label(ip, _METADATA):
            raise Blocked("metadata_address", _describe(address, ip, via, label))
    for ip, via in views:
        label = _non_public_label(ip)
        if label and not any(ip in net for net in allow_private):
            raise Blocked("private_address", _describe(address, ip, via, label))


def _views(address: Address) -> Iterator[tuple[Address, str]]:
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        yield address.ipv4_mapped, "IPv4-mapped"
        return
    yield address, ""
    if isinstance(address, IPv6Address):
        yield from _embedded_ipv4(int(address))


def _embedded_ipv4(value: int) -> Iterator[tuple[IPv4Address, str]]:
    low32, high96 = value & 0xFFFFFFFF, value >> 32
    if high96 == 0 and low32 > 1:  # :: and ::1 are themselves, not embeddings
        yield IPv4Address(low32), "IPv4-compatible"
    if high96 == 0xFFFF0000:
        yield IPv4Address(low32), "IPv4-translated"
    if value >> 112 == 0x2002:
        yield IPv4Address((value >> 80) & 0xFFFFFFFF), "6to4"
    if high96 == 0x64FF9B << 64 or value >> 80 == 0x64FF9B0001:
        yield IPv4Address(low32), "NAT64"
    if value >> 96 == 0x20010000:
        yield IPv4Address((value >> 64) & 0xFFFFFFFF), "Teredo server"
        yield IPv4Address(~value & 0xFFFFFFFF), "Teredo client"
    if high96 & 0xFCFFFFFF == 0x5EFE:  # interface id 0?00:5efe:a.b.c.d, any u/g bits
        yield IPv4Address(low32), "ISATAP"


def _non_public_label(ip: Address) -> str | None:
    if label := _label(ip, _NON_PUBLIC):
        return label
    if isinstance(ip, IPv6Address) and not any(ip in net for net in _V6_ROUTABLE):
        return "reserved (outside global unicast)"
    return None if ip.is_global else "not globally routable"


def _label(ip: Address, table: tuple[tuple[Network, str], ...]) -> str | None:
    return next((label for net, label in table if ip in net), None)


def _describe(address: Address, ip: Address, via: str, label: str) -> str:
    if ip == address and not via:
        return f"{address} is {label}"
    return f"{address} embeds {ip} ({via}), which is {label}"


def parse_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """Parse fetch.allow_private: addresses (a /32 or /128) or CIDR networks."""
    return tuple(_parse_network(entry) for entry in entries)


def _parse_network(entry: str) -> Network:
    hint = "write an address or CIDR network such as '10.0.0.0/8', '127.0.0.1' or '::1'"
    try:
        text = entry.strip()
    except AttributeError:
        raise ValueError(f"fetch.allow_private entry {entry!r} is not a string; {hint}") from None
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if "%" in text:
        raise ValueError(f"fetch.allow_private entry {entry!r} has an IPv6 zone id; {hint}")
    try:
        return ip_network(text, strict=True)
    except ValueError as exc:
        if "host bits set" in str(exc):
            suggestion = ip_network(text, strict=False)
            raise ValueError(
                f"fetch.allow_private entry {entry!r} has host bits set; did you mean '{suggestion}'?"
            ) from None
        raise ValueError(
            f"fetch.allow_private entry {entry!r} is not an IP address or network; {hint}"
        ) from None


# --- policy helpers ---------------------------------------------------------------------


def host_allowed(host: str, patterns: Sequence[str]) -> bool:
    """Whether the normalized `host` matches one of the fetch.allow_hosts globs.

    fnmatch semantics, case-insensitive: "*.example.com" matches any subdomain but not
    example.com itself. An IP host matches only "*" or a pattern that is that same IP.
    """
    name = _pattern_key(host)
    ip = _ip_or_none(name)
    return any(_host_matches(name, ip, _pattern_key(pattern)) for pattern in patterns)


def _host_matches(name: str, ip: Address | None, pattern: str) -> bool:
    if pattern == "*":
        return True
    if ip is not None:
        return _ip_or_none(pattern) == ip
    return fnmatch.fnmatchcase(name, pattern)


def _pattern_key(text: str) -> str:
    key = text.strip()
    if key.startswith("[") and key.endswith("]"):
        key = key[1:-1]
    key = key.lower().rstrip(".")
    labels = key.split(".")
    # A unicode label with no glob characters is encoded as the host would have been.
    return ".".join(
        _try_idna(label) if not label.isascii() and not set("*?[") & set(label) else label for label in labels
    )


def _try_idna(label: str) -> str:
    try:
        return _idna_label(unicodedata.normalize("NFKC", label))
    except Blocked:
        return label


def _ip_or_none(text: str) -> Address | None:
    try:
        return parse_ip_literal(text)
    except Blocked:
        return None


def origin_changed(a: Target, b: Target) -> bool:
    """Whether a redirect from `a` to `b` crosses origins, so credentials must be dropped."""
    return a.origin() != b.origin()
