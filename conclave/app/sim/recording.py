"""What the simulated panel remembers about each API request, with secrets masked.

Keys are replaced by a short sha256 fingerprint as they arrive, so a test can check
which key an adapter sent (`mask_secret("Bearer sk-test")`) while no key is ever stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import orjson

Kind = str  # a wire the panel speaks: a key of `conclave.app.sim.kinds.WIRES`

SECRET_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key"})
SECRET_QUERY_PARAMS = frozenset({"key"})


@dataclass(frozen=True)
class ReceivedRequest:
    """One API request as the panel saw it (control requests are not recorded)."""

    kind: Kind
    path: str
    model: str
    headers: Mapping[str, str]
    body: Any

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "model": self.model,
            "headers": dict(self.headers),
            "body": self.body,
        }


def mask_secret(value: str) -> str:
    """The fingerprint stored instead of a secret (for `Bearer X`, of the whole value)."""
    return "***sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:12]


def mask_headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Lower-case header names and mask the values of the ones that carry keys."""
    out: dict[str, str] = {}
    for name, value in items:
        lowered = name.lower()
        out[lowered] = mask_secret(value) if lowered in SECRET_HEADERS else value
    return out


def masked_path(path: str, query: Sequence[tuple[str, str]]) -> str:
    """The request path with its query string, any `key=` parameter masked."""
    if not query:
        return path
    safe = [(k, mask_secret(v) if k in SECRET_QUERY_PARAMS else v) for k, v in query]
    return path + "?" + urlencode(safe, safe="*:/")


def recording_json(records: Iterable[ReceivedRequest]) -> bytes:
    return orjson.dumps([r.to_dict() for r in records])
