"""JSON: value shapes, strict decoding, the schemas of `schemas/`, and the config checked against them."""
