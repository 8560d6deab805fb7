"""The tools a panel member may use mid-answer, `fetch` and `verify`: what a tool is (`spec`), the
registry the worker loop reaches them through (`registry`), what their handlers are handed
(`context`), and the tools themselves. Nothing is imported here: `conclave.app.catalog` reads
`spec` without loading the registry, the context or either tool."""
