"""Provider kinds as units: `conclave.providers.kinds.KINDS` is the one list of wire kinds, and
every place that must still name them by hand (the config's `ProviderKind`, the schemas' enums,
the simulated panel, the docs) is held to it here, so a kind added or dropped in one place and
forgotten in another fails with a message naming that place."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conclave.app.sim.kinds import WIRES
from conclave.app.sim.server import BASE_PATHS
from conclave.deliberation.session import NATIVE_KINDS
from conclave.providers import ADAPTERS
from conclave.providers.kinds import KINDS
from conclave.schema.config import ProviderKind

ROOT = Path(__file__).resolve().parents[1]
REGISTERED = sorted(KINDS)
ADD_A_KIND = "(adding a kind: docs/architecture.md#adding-a-wire-kind)"


def kind_enums(node: Any, where: str) -> Iterator[tuple[str, list[Any]]]:
    """(JSON path, values) of every enum of provider kinds in a schema: one under a `kind` key, or
    one that lists a registered kind (wherever a restructured schema puts it)."""
    if isinstance(node, dict):
        for key, value in node.items():
            enum = value.get("enum") if isinstance(value, dict) else None
            if isinstance(enum, list) and (key == "kind" or set(enum) & set(KINDS)):
                yield f"{where}.{key}", enum
            yield from kind_enums(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from kind_enums(item, f"{where}[{i}]")


def test_the_config_literal_names_the_registered_kinds() -> None:
    assert sorted(typing.get_args(ProviderKind)) == REGISTERED, (
        f"conclave/schema/config.py: ProviderKind must list the registered kinds {REGISTERED} {ADD_A_KIND}"
    )


# Schemas whose `kind` is not a provider's: an eval suite item's is the kind of its answer.
NOT_PROVIDER_KINDS = frozenset({"eval.item.json"})


def test_every_kind_enum_in_the_schemas_names_the_registered_kinds() -> None:
    found = [
        (f"{path.relative_to(ROOT)}: {where}", enum)
        for path in sorted((ROOT / "schemas").rglob("*.json"))
        if path.name not in NOT_PROVIDER_KINDS
        for where, enum in kind_enums(json.loads(path.read_text(encoding="utf-8")), "$")
    ]
    assert found, "no kind enum found in schemas/: the config schema's provider kind has one"
    wrong = [f"{place} is {sorted(enum)}" for place, enum in found if sorted(enum) != REGISTERED]
    assert not wrong, f"kind enums that do not list the registered kinds {REGISTERED} {ADD_A_KIND}:\n" + (
        "\n".join(wrong)
    )


def test_every_kind_has_its_simulated_counterpart() -> None:
    assert sorted(WIRES) == REGISTERED, (
        f"conclave/app/sim/kinds/__init__.py: WIRES must hold one wire per registered kind {REGISTERED}"
    )
    assert sorted(BASE_PATHS) == REGISTERED


def test_the_providers_wire_page_documents_every_kind() -> None:
    page = (ROOT / "docs" / "providers.md").read_text(encoding="utf-8")
    missing = [kind for kind in KINDS if f"`kind: {kind}`" not in page]
    assert not missing, f"docs/providers.md: no section says `kind: …` for {missing} {ADD_A_KIND}"


def test_what_depends_on_the_kind_is_read_from_the_registry() -> None:
    adapters = {kind: spec.adapter for kind, spec in KINDS.items()}
    assert adapters == ADAPTERS
    assert all(adapter.kind == kind for kind, adapter in adapters.items())
    native = {kind for kind, spec in KINDS.items() if spec.native_tools}
    assert native == NATIVE_KINDS
    names = {kind: spec.otel_name for kind, spec in KINDS.items()}
    # The GenAI conventions' own values for the providers they name.
    assert [names[kind] for kind in ("openai", "anthropic", "gemini")] == [
        "openai",
        "anthropic",
        "gcp.gemini",
    ]


def test_tracing_does_not_load_the_registry() -> None:
    """`conclave.obs.tracing` is on the path a starting `conclave serve` takes before its first
    answer; the registry brings the adapters and the HTTP stack (the provider client, which
    names the provider in its spans, reads the registry itself)."""
    probe = "import sys, conclave.obs.tracing\nprint('conclave.providers' in sys.modules)\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["False"]


def test_the_independence_contracts_name_every_kinds_module() -> None:
    """import-linter's `provider-kinds` and `sim-kinds` contracts (pyproject.toml) list modules by
    name: a kind missing from them would go unchecked while lint-imports still says "kept"."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    listed = {c["id"]: sorted(c["modules"]) for c in contracts["contracts"] if c["type"] == "independence"}
    adapters = sorted({type(spec.adapter).__module__ for spec in KINDS.values()})
    wires = sorted({type(wire).__module__ for wire in WIRES.values()})
    assert listed["provider-kinds"] == adapters, f"pyproject.toml: provider-kinds must list {adapters} {ADD_A_KIND}"
    assert listed["sim-kinds"] == wires, f"pyproject.toml: sim-kinds must list {wires} {ADD_A_KIND}"


def test_a_kind_without_native_tool_calling_gets_tags_whatever_was_asked(make_config: Any) -> None:
    """Its adapter has no field to declare tools in: asking `native` of it must not leave the
    model's tags to be judged forged tool output."""
    import dataclasses

    from conclave.deliberation.session import tool_mode

    config = make_config({"p": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}})
    native = config.providers["p"]
    text_only = dataclasses.replace(native, kind="text-only")  # type: ignore[arg-type]
    assert tool_mode("native", native, "auto") == "native"
    assert [tool_mode(asked, text_only, "native") for asked in ("native", "auto", None)] == ["tags"] * 3
