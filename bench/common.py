"""What every part of the suite shares: the operating points, the scripted panel models, the
generated Conclave configs and the small statistics helpers.

Nothing here imports Conclave, aiohttp or litellm, so the suite's parent process stays light
and each measured cell (`bench.cell`) pays only for what its contender really loads.
"""

from __future__ import annotations

import base64
import hashlib
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml

LATENCY_MS = 200.0  # the panel's fixed latency: every provider call takes this long at least
MAX_TOKENS = 256
QUESTION = "Which message queue fits a three-person team that already runs Postgres? (benchmark)"
TASK = "Design the cache layer for the billing API. (benchmark)"

OpKind = Literal["confer", "coordinate", "verify"]
CONTENDERS = ("conclave-api", "conclave-stdio", "conclave-http", "raw-aiohttp", "litellm")
CONCLAVE_CONTENDERS = ("conclave-api", "conclave-stdio", "conclave-http")
LIMIT = "raw-aiohttp"
LITELLM = "litellm"

# --------------------------------------------------------------------------- panel models

PLAIN_MODELS = tuple(f"bench-m{i}" for i in range(5))  # default answers, no script
VERIFY_MODELS = tuple(f"bench-v{i}" for i in range(3))  # one verify hop, then the final answer
PROPOSER, CRITICS, SYNTHESIZER = "bench-proposer", ("bench-critic-1", "bench-critic-2"), "bench-synth"

VERIFY_CHECK = {"type": "math", "expression": "1+1", "expected": 2}
VERIFY_TAG = (
    '<tool_call>{"name":"verify","args":{"checks":[{"type":"math","expression":"1+1","expected":2}]}}'
    "</tool_call>"
)
VERIFY_FINAL = "Checked with verify: 1+1 is 2. Final answer: option 2."

PROPOSAL_ENVELOPE = {
    "proposal": "A read-through Redis cache in front of the billing API, 60 s TTL, keyed by account.",
    "rationale": "Reads dominate; a short TTL bounds staleness; invalidation on writes keeps it honest.",
    "assumptions": ["Billing reads outnumber writes ten to one."],
    "confidence": 0.7,
}
CRITIC_ENVELOPE = {
    "verdict": "revise",
    "issues": [
        {"severity": "minor", "description": "No stampede protection on expiry.", "suggestion": "Jitter."}
    ],
    "summary": "Sound, with one gap.",
    "confidence": 0.6,
}
SYNTH_ENVELOPE = {
    "answer": "A read-through Redis cache, 60 s TTL with jitter, invalidated on writes.",
    "confidence": 0.75,
    "resolved": ["Stampedes: TTL jitter, as the critic suggested."],
    "dissent": [],
}


def scenarios() -> dict[str, dict[str, Any]]:
    """The scripts PUT to the panel (`/_sim/scenarios/{model}`), in `Scenario.from_dict` form."""
    out: dict[str, dict[str, Any]] = {}
    for model in VERIFY_MODELS:
        out[model] = {
            "replies": [{"text": VERIFY_TAG}],  # the last reply repeats: every first call asks for verify
            "rules": [{"contains": "<tool_result", "reply": {"text": VERIFY_FINAL}}],
        }
    out[PROPOSER] = {"replies": [{"text": orjson.dumps(PROPOSAL_ENVELOPE).decode()}]}
    for model in CRITICS:
        out[model] = {"replies": [{"text": orjson.dumps(CRITIC_ENVELOPE).decode()}]}
    out[SYNTHESIZER] = {"replies": [{"text": orjson.dumps(SYNTH_ENVELOPE).decode()}]}
    return out


# --------------------------------------------------------------------------- operating points


@dataclass(frozen=True, slots=True)
class Point:
    """One operating point: `n` closed-loop workers, started together, each running one
    operation of the burst (all N begun at once) and then `per_worker` measured ones."""

    id: str
    kind: OpKind
    k: int  # provider calls per stage (panel size for confer / verify)
    n: int  # operations in flight at once
    per_worker: int  # operations per worker after the burst's one
    warmup: int  # unmeasured operations per worker first (connections, code paths)
    ideal_ms: float  # the critical path: what a zero-overhead client would take

    @property
    def calls_per_op(self) -> int:
        if self.kind == "coordinate":
            return 1 + len(CRITICS) + 1
        return self.k * (2 if self.kind == "verify" else 1)

    @property
    def ops(self) -> int:
        """Operations in a measured run, the burst's included."""
        return self.n * (1 + self.per_worker)

    @property
    def label(self) -> str:
        if self.kind == "coordinate":
            return f"coordinate 1+{len(CRITICS)}+1, N={self.n}"
        what = "confer+verify hop" if self.kind == "verify" else "confer"
        return f"{what} K={self.k} N={self.n}"

    def models(self) -> tuple[str, ...]:
        if self.kind == "coordinate":
            return (PROPOSER, *CRITICS, SYNTHESIZER)
        return (VERIFY_MODELS if self.kind == "verify" else PLAIN_MODELS)[: self.k]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "calls_per_op": self.calls_per_op, "label": self.label}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Point:
        return cls(**{k: d[k] for k in ("id", "kind", "k", "n", "per_worker", "warmup", "ideal_ms")})


def points(*, quick: bool, seq_ops: int, high_n: int) -> tuple[Point, ...]:
    """The operating points of a run. `quick` is a smoke test: small N, few operations."""
    one, two, three = LATENCY_MS, 2 * LATENCY_MS, 3 * LATENCY_MS
    if quick:
        return (
            Point("k3n1", "confer", 3, 1, 4, 1, one),
            Point("k5n100", "confer", 5, 20, 2, 1, one),
            Point("k5n500", "confer", 5, 50, 2, 1, one),
            Point("coordinate", "coordinate", 1, 1, 2, 1, three),
            Point("verify", "verify", 3, 1, 2, 1, two),
        )
    return (
        Point("k3n1", "confer", 3, 1, seq_ops, 3, one),
        Point("k5n100", "confer", 5, 100, 5, 1, one),
        Point("k5n500", "confer", 5, high_n, 4, 1, one),  # 4: a steady window after the burst
        Point("coordinate", "coordinate", 1, 1, max(seq_ops // 4, 3), 1, three),
        Point("verify", "verify", 3, 1, max(seq_ops // 2, 3), 1, two),
    )


# --------------------------------------------------------------------------- configs


@dataclass(frozen=True, slots=True)
class ConfigVariant:
    """How the generated Conclave config treats the event log and transcripts."""

    name: str = "default"
    telemetry: bool = True  # False: telemetry.enabled false, or telemetry.path /dev/null without that switch
    transcripts: bool = True


VARIANTS = {
    "default": ConfigVariant(),
    "telemetry-only": ConfigVariant("telemetry-only", telemetry=True, transcripts=False),
    "transcripts-only": ConfigVariant("transcripts-only", telemetry=False, transcripts=True),
    "off": ConfigVariant("off", telemetry=False, transcripts=False),
}


def telemetry_switch() -> bool:
    """Whether the config schema has `telemetry.enabled`; older ones only allow a path (/dev/null)."""
    schema_path = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.json"
    try:
        schema = orjson.loads(schema_path.read_bytes())
        return "enabled" in schema["properties"]["telemetry"]["properties"]
    except (OSError, KeyError, orjson.JSONDecodeError):
        return False


def telemetry_off_means() -> str:
    return "telemetry.enabled false" if telemetry_switch() else "telemetry.path /dev/null (no config switch)"


def _key_body(seed: str, length: int) -> str:
    stream = hashlib.sha512(seed.encode()).digest() * (length // 64 + 1)
    return base64.urlsafe_b64encode(stream).decode()[:length]


# What a user with four providers configured has: keys shaped and sized like OpenAI's project
# keys, Anthropic's, Gemini's and xAI's. The bench's members send them, so Conclave's redaction
# screens every event line and transcript for all four in every spelling, as it does for such
# a user (with no keys configured, that work was missing from every figure).
BENCH_KEYS = {
    "CONCLAVE_BENCH_OPENAI_KEY": "sk-proj-" + _key_body("openai", 156),
    "CONCLAVE_BENCH_ANTHROPIC_KEY": "sk-ant-api03-" + _key_body("anthropic", 95),
    "CONCLAVE_BENCH_GEMINI_KEY": "AIza" + _key_body("gemini", 35),
    "CONCLAVE_BENCH_XAI_KEY": "xai-" + _key_body("xai", 80),
}


def bench_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (the empty environment by default) plus the bench's provider keys."""
    return {**(base or {}), **BENCH_KEYS}


def write_config(
    work: Path, openai_url: str, variant: ConfigVariant, *, max_concurrency: int, tag: str = ""
) -> Path:
    """A Conclave config whose providers are the panel's bench models (kind openai).

    Every model is its own provider entry, so K providers per confer are K distinct
    upstream models, as with a real panel; each uses one of `BENCH_KEYS` (load the config with
    `bench_env()`). The event log and transcripts go under `work`.
    """
    price = {"input_per_mtok": 0.4, "output_per_mtok": 1.6}
    models = (*PLAIN_MODELS, *VERIFY_MODELS, PROPOSER, *CRITICS, SYNTHESIZER)
    key_names = list(BENCH_KEYS)
    providers = {
        m: {
            "kind": "openai",
            "model": m,
            "base_url": openai_url,
            "api_key_env": key_names[index % len(key_names)],
            "price": price,
            # Like for like: the other contenders read whole bodies, so Conclave does too here.
            # What streaming costs is bench.streaming's to measure (docs/performance.md#streaming).
            "stream": False,
        }
        for index, m in enumerate(models)
    }
    suffix = f"-{tag}" if tag else ""
    raw = {
        "providers": providers,
        "panel": list(PLAIN_MODELS[:3]),
        "roles": {
            "proposer": PROPOSER,
            "critics": list(CRITICS),
            "synthesizer": SYNTHESIZER,
            "synthesizer_fallbacks": [],
        },
        "limits": {"timeout_seconds": 120, "max_tokens": MAX_TOKENS, "max_concurrency": max_concurrency},
        "telemetry": (
            {"path": str(work / f"events-{variant.name}{suffix}.ndjson")}
            if variant.telemetry
            else ({"enabled": False} if telemetry_switch() else {"path": "/dev/null"})
        ),
        "transcripts": {
            "enabled": variant.transcripts,
            "dir": str(work / f"transcripts-{variant.name}{suffix}"),
        },
    }
    path = work / f"config-{variant.name}{suffix}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def op_arguments(point: Point) -> dict[str, Any]:
    """The tool arguments Conclave gets for one operation of `point`."""
    if point.kind == "coordinate":
        return {"task": TASK, "proposer": PROPOSER, "critics": list(CRITICS), "synthesizer": SYNTHESIZER}
    args: dict[str, Any] = {"question": QUESTION, "providers": list(point.models())}
    if point.kind == "verify":
        args["worker_tools"] = ["verify"]
    return args


def op_method(point: Point) -> str:
    return "coordinate" if point.kind == "coordinate" else "confer"


# --------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of repeated measurements and their range."""

    median: float
    low: float
    high: float
    n: int
    values: tuple[float, ...] = field(default=())

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        kept = tuple(v for v in values if v is not None and not math.isnan(v))
        if not kept:
            return None
        return cls(statistics.median(kept), min(kept), max(kept), len(kept), kept)

    def fmt(self, digits: int = 1, *, scale: float = 1.0) -> str:
        m, lo, hi = self.median * scale, self.low * scale, self.high * scale
        if self.n == 1:
            return f"{m:.{digits}f}"
        return f"{m:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n, "values": self.values}
