"""The package's layout (docs/architecture.md#layers): no import cycle at all, and a top level of
the layers alone. import-linter's contracts (pyproject.toml, run by scripts/test) hold the layers;
what they cannot see is checked here: a cycle through a package's own `__init__` (`conclave.tools`
<-> `conclave.tools.registry`) keeps every contract, `acyclic_siblings` included, since a package
is not its children's sibling.

Every import counts, `if TYPE_CHECKING:` and function-level ones included, as grimp reads them.
"""

from __future__ import annotations

from pathlib import Path

import grimp

import conclave

TOP_LEVEL = {
    *("__init__.py", "__main__.py", "py.typed", "prompts"),
    *("app", "deliberation", "worker", "tools", "providers", "state", "net", "obs", "schema", "core"),
}


def test_no_import_comes_back_to_its_importer_type_checking_imports_included() -> None:
    graph = grimp.build_graph("conclave", cache_dir=None)  # TYPE_CHECKING imports included
    cycles = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                cycles.append(" -> ".join((importer, *back)))
    assert cycles == [], "import cycles (break them as docs/architecture.md#layers says):\n" + "\n".join(
        cycles
    )


def test_the_top_level_is_the_layers() -> None:
    here = Path(conclave.__file__).parent
    assert {p.name for p in here.iterdir() if p.name != "__pycache__"} == TOP_LEVEL
