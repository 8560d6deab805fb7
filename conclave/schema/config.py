"""Configuration: one function resolves CLI > environment > file > defaults into a frozen Config.

Discovery: `--config PATH`, else `CONCLAVE_CONFIG`, else `./config.yaml`, else the packaged
default. A user's file is layered over the packaged default (docs/configuration.md): it need
only say what differs. Keys come from the environment or a local `.env`, never from the file.
Every error is one line naming the key path, where the value came from, and the fix.
"""

from __future__ import annotations

import importlib.util
import os
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from conclave.core.errors import ConfigError
from conclave.schema.schemas import data_path, first_error, json_path

ProviderKind = Literal["openai", "anthropic", "gemini"]
CostCapMode = Literal["warn", "enforce", "off"]
WorkerToolMode = Literal["auto", "native", "tags"]


@dataclass(frozen=True, slots=True)
class PriceConfig:
    """USD per 1M tokens. Cache prices default to the input price when unknown."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    name: str
    kind: ProviderKind
    model: str
    base_url: str
    api_key_env: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    price: PriceConfig | None = None
    reasoning: bool | None = None  # None: decided from the model name
    max_tokens_field: str | None = None  # openai kind only; None: decided from model and host
    tool_mode: Literal["native", "tags"] | None = None  # None: worker_tools.mode decides
    # openai kind: the API takes `prompt_cache_key` (OpenAI's own does); servers that do not
    # know the field may refuse the request, so it is never inferred from the host.
    prompt_cache_key: bool = False
    # The API holds an answer to a JSON Schema (docs/providers.md#structured-output) where its
    # kind can; false for a server that takes the kind's wire but not that field: the schema then
    # goes in the prompt alone.
    structured_output: bool = True
    # Answers are read as the provider streams them (docs/providers.md#streaming) where the kind
    # can; false for a server that cannot stream: plain calls only.
    stream: bool = True
    # Who answers for this provider as a confer member when its call fails for good
    # (docs/tools.md#member-fallbacks), in order.
    fallbacks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RolesConfig:
    proposer: str
    critics: tuple[str, ...]
    synthesizer: str
    synthesizer_fallbacks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RetryConfig:
    max_attempts: int = 3
    initial_delay_seconds: float = 0.5
    max_delay_seconds: float = 8.0
    max_retry_after_seconds: float = 60.0
    attempt_timeout_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    # below the 60 s many MCP clients give a tool call (docs/server.md#long-deliberations)
    timeout_seconds: float = 50.0
    max_tokens: int = 1024
    temperature: float | None = None
    max_concurrency: int = 64
    retry: RetryConfig = field(default_factory=RetryConfig)


@dataclass(frozen=True, slots=True)
class WorkerToolsConfig:
    hop_budget: int = 2
    result_max_bytes: int = 65536
    cost_cap_usd: float = 0.0
    cost_cap_mode: CostCapMode = "warn"
    mode: WorkerToolMode = "auto"


@dataclass(frozen=True, slots=True)
class FetchConfig:
    allow_hosts: tuple[str, ...] = ("*",)
    allow_private: tuple[str, ...] = ()
    allow_ports: tuple[int, ...] = (80, 443)
    max_bytes: int = 1_048_576
    connect_timeout_seconds: float = 5.0
    read_timeout_seconds: float = 10.0
    total_timeout_seconds: float = 20.0
    max_redirects: int = 5
    session_max_bytes: int = 10_485_760
    session_max_requests: int = 20


@dataclass(frozen=True, slots=True)
class BreakersConfig:
    failure_threshold: int = 5
    cooldown_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    enabled: bool = True
    path: str = ".conclave/events.ndjson"
    include_content: bool = False
    otel: bool = False  # OpenTelemetry spans over OTLP (the extra conclave[otel]; OTEL_* variables)


@dataclass(frozen=True, slots=True)
class TranscriptsConfig:
    enabled: bool = True
    dir: str = ".conclave/transcripts"
    fsync: bool = False  # rename alone is atomic against crashes; fsync adds power-loss durability


@dataclass(frozen=True, slots=True)
class FollowUpsConfig:
    # A follow-up's history per member, estimated at 4 characters a token; the oldest turns go first.
    max_history_tokens: int = 8000


@dataclass(frozen=True, slots=True)
class EvalsConfig:
    # `conclave eval` writes each run under <dir>/<run>/ by default; `conclave ui` lists them there
    dir: str = ".conclave/evals"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    # A call with a progressToken hears from the server at least this often, so that clients
    # whose idle timer is reset by progress keep waiting through a long deliberation.
    progress_heartbeat_seconds: float = 10.0
    ui: bool = False  # serve --http also serves the page of `conclave ui` at /ui/ (docs/ui.md)


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Where state that outlives one call lives (docs/deploying.md): this process's memory, or a Redis
    shared by every replica. The URL may carry a password, so it is never shown whole."""

    backend: str = "memory"  # memory | redis
    redis_url: str | None = None  # CONCLAVE_REDIS_URL wins; a password belongs only there
    namespace: str = "conclave"  # key prefix: replicas that share state share it
    lease_seconds: float = 15.0  # a dead replica's slots and claims are freed after this


@dataclass(frozen=True, slots=True)
class TasksConfig:
    ttl_seconds: int = 3600  # a finished task's result is kept this long after its creation
    poll_interval_ms: int = 2000  # what clients are asked to wait between polls


class Secrets:
    """API key values by environment variable name. Never printed, never serialized."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = {k: v for k, v in values.items() if v}

    def get(self, env_name: str | None) -> str | None:
        return self._values.get(env_name) if env_name else None

    def values(self) -> tuple[str, ...]:
        return tuple(self._values.values())

    def __repr__(self) -> str:
        return f"Secrets(<{len(self._values)} hidden>)"


@dataclass(frozen=True, slots=True)
class Config:
    providers: Mapping[str, ProviderConfig]
    panel: tuple[str, ...]
    roles: RolesConfig
    limits: LimitsConfig
    worker_tools: WorkerToolsConfig
    fetch: FetchConfig
    breakers: BreakersConfig
    telemetry: TelemetryConfig
    transcripts: TranscriptsConfig
    source: str
    secrets: Secrets = field(repr=False, compare=False)
    server: ServerConfig = field(default_factory=ServerConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    state: StateConfig = field(default_factory=StateConfig)
    evals: EvalsConfig = field(default_factory=EvalsConfig)
    follow_ups: FollowUpsConfig = field(default_factory=FollowUpsConfig)

    def api_key(self, provider: str) -> str | None:
        return self.secrets.get(self.providers[provider].api_key_env)

    def key_present(self, provider: str) -> bool:
        entry = self.providers[provider]
        return entry.api_key_env is None or self.api_key(provider) is not None


CONFIG_SCHEMA = "config.schema.json"
REDIS_URL_ENV = "CONCLAVE_REDIS_URL"


def find_config_file(cli_path: str | None, env: Mapping[str, str]) -> Path:
    """The discovery order of docs/configuration.md#where-the-config-comes-from; an explicitly
    named file must exist."""
    for explicit, origin in ((cli_path, "--config"), (env.get("CONCLAVE_CONFIG"), "CONCLAVE_CONFIG")):
        if explicit:
            path = Path(explicit).expanduser()
            if path.is_dir():
                raise ConfigError(
                    f"config: {str(path)!r} named by {origin} is a directory, not a config file; "
                    "name the YAML file inside it (e.g. config.yaml)"
                )
            if not path.is_file():
                raise ConfigError(
                    f"config: file {str(path)!r} named by {origin} does not exist; "
                    "fix the path or drop it to use ./config.yaml or the packaged default"
                )
            return path
    local = Path("config.yaml")
    return local if local.is_file() else data_path("config.yaml")


def read_dotenv(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a local `.env`; comments, blanks and `export ` prefixes allowed."""
    if not path.is_file():
        return {}
    values: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}; fix its permissions") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config: {path} is not UTF-8 text (byte {exc.start}); write it as KEY=VALUE lines or remove it"
        ) from None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        values[key.strip()] = value.strip().strip("'\"")
    return values


def load_config(
    cli_path: str | None = None,
    *,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    dotenv: Path | None = Path(".env"),
) -> Config:
    """Resolve the configuration: CLI (`--config`, `--set a.b=v`) > environment > file > defaults."""
    environ = dict(os.environ if env is None else env)
    path = find_config_file(cli_path, environ)
    raw = _layered(path)
    origins = Origins(path)
    _apply_env_overrides(raw, environ, origins)
    for item in overrides:
        _apply_override(raw, item, origins)
    keys = {**(read_dotenv(dotenv) if dotenv else {}), **environ}
    _check_redis_url(raw, origins)
    if url := keys.get(REDIS_URL_ENV):  # after the check: the variable may carry a password
        raw.setdefault("state", {})["redis_url"] = url
    _validate(raw, origins)
    _check_state(raw, origins)
    return _build(raw, str(path), keys)


class Origins:
    """Where each value came from, so an error blames the file, a `--set` or a variable rightly."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._set: dict[str, str] = {}  # dotted key -> "from --set a.b=v"

    def record(self, dotted: str, origin: str) -> None:
        self._set[dotted] = origin

    def of(self, *key_paths: str, unknown: Sequence[str] = ()) -> str:
        """`(from --set ...)` when one of the paths is (inside) a value set outside the file, or
        one of the `unknown` keys holds one (`limts` holds `--set limts.timeout_seconds=5`)."""
        for dotted, origin in self._set.items():
            inside = any(p == dotted or p.startswith((f"{dotted}.", f"{dotted}[")) for p in key_paths)
            if inside or any(dotted.startswith(f"{key}.") or dotted == key for key in unknown):
                return f"({origin})"
        return f"(in {self.path})"


def _layered(path: Path) -> dict[str, Any]:
    """The user's file over the packaged default: a file that sets only `panel`, or only
    `providers.openai.model`, keeps every other default and preset."""
    raw = _read_yaml(path)
    default = data_path("config.yaml")
    if path.resolve() == default.resolve():
        return raw
    return _merge(_read_yaml(default), raw, ())


def _merge(base: dict[str, Any], over: dict[str, Any], where: tuple[str, ...]) -> dict[str, Any]:
    """Mappings merge key by key; any other value replaces. A provider entry's fields replace
    whole: a user's `price` is the price, not a patch over the preset's cache rates."""
    merged: dict[str, Any] = {}  # the user's keys first: their own providers lead every listing
    for key, value in over.items():
        below = base.get(key)
        atomic = len(where) == 2 and where[0] == "providers"
        if isinstance(value, dict) and isinstance(below, dict) and not atomic:
            merged[key] = _merge(below, value, (*where, key))
        else:
            merged[key] = value
    return merged | {key: value for key, value in base.items() if key not in over}


def _check_redis_url(raw: dict[str, Any], origins: Origins) -> None:
    """A password in a config file would end up in the repository; it belongs in the variable."""
    state = raw.get("state")
    url = state.get("redis_url") if isinstance(state, dict) else None
    if isinstance(url, str) and _password(url):
        raise ConfigError(
            f"config: state.redis_url carries a password; put the whole URL in the environment "
            f"variable {REDIS_URL_ENV} (or .env) instead {origins.of('state.redis_url')}"
        )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}; check the path") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config: {path} is not UTF-8 text (invalid byte at offset {exc.start}); a config file is YAML"
        ) from None
    data = _parse_yaml(text, str(path))
    if data is None:
        raise ConfigError(
            f"config: {path} is empty; write only what differs from the packaged default (e.g. "
            "panel: [openai, anthropic]; its config.yaml is a commented example) or drop the file"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path}: the top level must be a mapping of sections")
    _check_keys(data, path)
    return data


def _parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or "invalid YAML"
        raise ConfigError(f"config: {where}{at}: {problem}; fix the YAML syntax") from None
    except RecursionError:
        raise ConfigError(f"config: {where}: nested too deeply to read; fix the YAML") from None


def _check_keys(data: dict[str, Any], path: Path) -> None:
    """Every mapping key must be a string: YAML reads `1:`, `yes:` or `null:` as a number, a
    boolean or null, which would reach provider names and headers (and break JSON output).
    Each node is visited once, so aliases (even a recursive one) cost nothing extra."""
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, where = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, list):
            stack.extend((child, f"{where}[{index}]") for index, child in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key, child in node.items():
            if not isinstance(key, str):
                raise ConfigError(
                    f"config: {where or '(top level)'}: key {_show(key)} is not a string (YAML reads "
                    f"unquoted numbers, yes/no, null and dates as other types); quote it (in {path})"
                )
            stack.append((child, f"{where}.{key}" if where else key))


def _apply_env_overrides(raw: dict[str, Any], env: Mapping[str, str], origins: Origins) -> None:
    if (panel := env.get("CONCLAVE_PANEL")) is not None and panel.strip():
        names = [p.strip() for p in panel.split(",") if p.strip()]
        if not names:
            raise ConfigError(
                f"config: CONCLAVE_PANEL={panel!r} names no provider; set it to names separated "
                "by commas (e.g. openai,anthropic) or unset it to use the config's panel"
            )
        raw["panel"] = names
        origins.record("panel", "from CONCLAVE_PANEL")
    if path := env.get("CONCLAVE_TELEMETRY_PATH"):
        raw.setdefault("telemetry", {})["path"] = path
        origins.record("telemetry.path", "from CONCLAVE_TELEMETRY_PATH")


def _apply_override(raw: dict[str, Any], item: str, origins: Origins) -> None:
    """`--set limits.timeout_seconds=30`: the value is parsed as YAML."""
    dotted, sep, value = item.partition("=")
    if not sep or not dotted:
        raise ConfigError(f"config: --set {item!r}: write it as section.key=value")
    *parents, leaf = dotted.split(".")
    node = raw
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config: --set {dotted}: {part} is not a section")
        node = child
    try:
        node[leaf] = yaml.safe_load(value)
    except (yaml.YAMLError, RecursionError):
        raise ConfigError(
            f"config: --set {dotted}: value {_show(value)} is not valid YAML (--set values are "
            "read as YAML: a list is [a, b], a string with : or # is quoted)"
        ) from None
    origins.record(dotted, f"from --set {item}")


def _validate(raw: dict[str, Any], origins: Origins) -> None:
    error = first_error(CONFIG_SCHEMA, raw)
    if error is not None:
        where = json_path(error).removeprefix("$.") if error.absolute_path else "(top level)"
        at = "" if where == "(top level)" else where
        unknown = _unknown_keys(error, at)
        origin = origins.of(at, unknown=unknown)
        hint = _yaml_hint(error) if origin.startswith("(from --set") else ""
        raise ConfigError(f"config: {where}: {_explain(error)}{hint} {origin}")
    _check_references(raw, origins)
    _check_paths(raw, origins)


def _unknown_keys(error: Any, at: str) -> list[str]:
    """An unknown key is reported on its parent, but it is the key itself that someone wrote."""
    if error.validator != "additionalProperties" or not isinstance(error.instance, dict):
        return []
    known = error.schema.get("properties", {})
    return [f"{at}.{key}" if at else key for key in error.instance if key not in known]


def _yaml_hint(error: Any) -> str:
    """`--set panel=openai,xai` reads as one string; say how YAML writes a list."""
    if (
        error.validator == "type"
        and isinstance(error.instance, str)
        and "array" in str(error.validator_value)
    ):
        return f" (--set values are read as YAML: write a list as [{error.instance}])"
    return ""


def _check_paths(raw: dict[str, Any], origins: Origins) -> None:
    """The event log must be a file, `transcripts.dir` and `evals.dir` folders: caught here as one
    line, not later as a traceback from the first write."""
    telemetry, transcripts = raw.get("telemetry", {}), raw.get("transcripts", {})
    log = Path(telemetry.get("path", TelemetryConfig().path)).expanduser()
    if telemetry.get("enabled", True) and log.is_dir():
        raise ConfigError(
            f"config: telemetry.path: {str(log)!r} is a directory; name the event log file, "
            f"e.g. {str(log / 'events.ndjson')!r} {origins.of('telemetry.path')}"
        )
    folder = Path(transcripts.get("dir", TranscriptsConfig().dir)).expanduser()
    if transcripts.get("enabled", True) and folder.exists() and not folder.is_dir():
        raise ConfigError(
            f"config: transcripts.dir: {str(folder)!r} is a file, not a folder; name a folder "
            f"{origins.of('transcripts.dir')}"
        )
    evals = Path(raw.get("evals", {}).get("dir", EvalsConfig().dir)).expanduser()
    if evals.exists() and not evals.is_dir():
        raise ConfigError(
            f"config: evals.dir: {str(evals)!r} is a file, not a folder; name a folder "
            f"{origins.of('evals.dir')}"
        )


def _explain(error: Any) -> str:
    if error.validator == "additionalProperties":
        allowed = ", ".join(sorted(error.schema.get("properties", {})))
        return f"{error.message}; remove it (allowed here: {allowed})"
    if error.validator == "required":
        return f"{error.message}; add it"
    if error.validator == "type":
        return f"{_show(error.instance)} is not of type {error.validator_value!r}; fix the value"
    if error.validator == "enum":
        return f"{_show(error.instance)} is not one of {error.validator_value}; use one of those"
    if error.validator == "minItems" and error.validator_value == 1:
        return "is empty; name at least one provider (e.g. [openai])"
    return f"{error.message}; fix the value"


_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict = 3, 80, 80, 6, 6


def _show(value: Any) -> str:
    """A short repr, whatever the size or depth of the value: a config error is one line."""
    return _SHOW.repr(value)


def _check_references(raw: dict[str, Any], origins: Origins) -> None:
    """Every provider named by panel or roles must be defined under `providers`."""
    known = set(raw.get("providers", {}))
    roles = raw.get("roles", {})
    named: list[tuple[str, str]] = [(f"panel[{i}]", n) for i, n in enumerate(raw.get("panel", []))]
    for key in ("proposer", "synthesizer"):
        if key in roles:
            named.append((f"roles.{key}", roles[key]))
    for key in ("critics", "synthesizer_fallbacks"):
        named += [(f"roles.{key}[{i}]", n) for i, n in enumerate(roles.get(key, []))]
    for owner, entry in raw.get("providers", {}).items():
        for i, name in enumerate(entry.get("fallbacks") or ()):
            where = f"providers.{owner}.fallbacks[{i}]"
            if name == owner:
                raise ConfigError(
                    f"config: {where}: a provider cannot be its own fallback; name another "
                    f"{origins.of(where)}"
                )
            named.append((where, name))
    for where, name in named:
        if name not in known:
            raise ConfigError(
                f"config: {where}: provider {name!r} is not defined; add it under providers "
                f"or use one of: {', '.join(sorted(known)) or '(none defined)'} {origins.of(where)}"
            )


def _build(raw: dict[str, Any], source: str, keys: Mapping[str, str]) -> Config:
    providers = {name: _provider(name, entry) for name, entry in raw.get("providers", {}).items()}
    panel = tuple(raw["panel"])
    return Config(
        providers=providers,
        panel=panel,
        roles=_roles(raw.get("roles", {}), panel),
        limits=_limits(raw.get("limits", {})),
        worker_tools=WorkerToolsConfig(**raw.get("worker_tools", {})),
        fetch=_fetch(raw.get("fetch", {})),
        breakers=BreakersConfig(**raw.get("breakers", {})),
        telemetry=TelemetryConfig(**raw.get("telemetry", {})),
        transcripts=TranscriptsConfig(**raw.get("transcripts", {})),
        source=source,
        secrets=_secrets(providers, keys),
        server=ServerConfig(**raw.get("server", {})),
        tasks=TasksConfig(**raw.get("tasks", {})),
        state=StateConfig(**raw.get("state", {})),
        evals=EvalsConfig(**raw.get("evals", {})),
        follow_ups=FollowUpsConfig(**raw.get("follow_ups", {})),
    )


def _check_state(raw: dict[str, Any], origins: Origins) -> None:
    state = raw.get("state", {})
    if problem := redis_backend_problem(state.get("backend", "memory"), state.get("redis_url")):
        raise ConfigError(f"{problem} {origins.of('state.backend', 'state.redis_url')}")


def redis_backend_problem(backend: str, redis_url: str | None) -> str | None:
    """What keeps `state.backend: redis` from working (no Redis named, or no client to reach
    it), as a one-line config error with its fix; None when nothing does."""
    if backend != "redis":
        return None
    if not redis_url:
        return (
            f"config: state.backend is redis but no Redis is named: set the environment variable "
            f"{REDIS_URL_ENV} (e.g. redis://127.0.0.1:6379/0) or state.redis_url"
        )
    if importlib.util.find_spec("redis") is None:
        return (
            "config: state.backend is redis but the redis package is not installed: install "
            "conclave[redis] (pip install 'conclave[redis]'), or use state.backend: memory"
        )
    return None


def _password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:
        return None  # not a URL at all: the schema check says so


def _secrets(providers: Mapping[str, ProviderConfig], keys: Mapping[str, str]) -> Secrets:
    """The API keys the providers name, and the Redis password, so the log redacts them all."""
    wanted = {p.api_key_env for p in providers.values() if p.api_key_env}
    values = {name: keys[name] for name in wanted if name in keys}
    if (password := _password(keys.get(REDIS_URL_ENV, ""))) is not None:
        values[f"{REDIS_URL_ENV} password"] = password
    return Secrets(values)


def _provider(name: str, entry: Mapping[str, Any]) -> ProviderConfig:
    price = entry.get("price")
    return ProviderConfig(
        name=name,
        kind=entry["kind"],
        model=entry["model"],
        base_url=entry["base_url"].rstrip("/"),
        api_key_env=entry.get("api_key_env"),
        headers=dict(entry.get("headers") or {}),
        price=PriceConfig(**price) if price else None,
        reasoning=entry.get("reasoning"),
        max_tokens_field=entry.get("max_tokens_field"),
        tool_mode=entry.get("tool_mode"),
        prompt_cache_key=bool(entry.get("prompt_cache_key")),
        structured_output=entry.get("structured_output", True),
        stream=entry.get("stream", True),
        fallbacks=tuple(entry.get("fallbacks") or ()),
    )


def _roles(raw: Mapping[str, Any], panel: tuple[str, ...]) -> RolesConfig:
    """Roles the config leaves out are derived from the panel: its first member proposes, the
    others critique, the first other than the proposer synthesizes (so the proposer never
    judges its own proposal unless the panel has one member), the rest are its fallbacks."""
    proposer = raw.get("proposer", panel[0])
    others = [p for p in panel if p != proposer]
    critics = tuple(raw.get("critics", others))
    synthesizer = raw.get("synthesizer", others[0] if others else proposer)
    fallbacks = raw.get("synthesizer_fallbacks")
    if fallbacks is None:
        fallbacks = [p for p in panel if p != synthesizer]
    return RolesConfig(proposer, critics, synthesizer, tuple(fallbacks))


def _limits(raw: Mapping[str, Any]) -> LimitsConfig:
    fields = dict(raw)
    retry = RetryConfig(**fields.pop("retry", {}))
    return LimitsConfig(retry=retry, **fields)


def _fetch(raw: Mapping[str, Any]) -> FetchConfig:
    fields = dict(raw)
    for key in ("allow_hosts", "allow_private", "allow_ports"):
        if key in fields:
            fields[key] = tuple(fields[key])
    return FetchConfig(**fields)
