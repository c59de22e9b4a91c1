"""What the structured-output tests share (tests/runtime/test_constrain.py,
tests/server/test_server_structured.py): a model whose context holds a whole JSON reply, the
schemas they ask for, and a validator of the JSON Schema subset those schemas use (checked
again with the `jsonschema` package where it is installed)."""
from __future__ import annotations

import json
from pathlib import Path

# Bounded strings, numbers and lists: a random model samples near-uniformly among the tokens
# a schema allows, so an unbounded string would end only by chance at each token.
PERSON = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "active", "tags"],
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "active": {"type": "boolean"},
                         "tags": {"type": "array", "maxItems": 3,
                                  "items": {"enum": ["red", "green", "blue"]}},
                         "nick": {"anyOf": [{"type": "null"},
                                            {"type": "string", "maxLength": 6}]}}}
# Recursive: a node holds at most one node (a list whose length is geometric: finite).
CHAIN = {"$defs": {"node": {"type": "object", "additionalProperties": False,
                            "required": ["v", "next"],
                            "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "next": {"type": "array", "maxItems": 1,
                                                    "items": {"$ref": "#/$defs/node"}}}}},
         "$ref": "#/$defs/node"}
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8},
                          "unit": {"enum": ["C", "F"]}}}
ADD = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
       "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                      "b": {"type": "integer", "minimum": -99, "maximum": 99}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
# A chat template that reads `tools`, as Qwen's does (short: the model is small).
TOOLS_TEMPLATE = ("{% if tools %}t:{% for t in tools %}{{ t.function.name }};{% endfor %}"
                  "{% endif %}{% for m in messages %}{{ m['role'][0] }}:"
                  "{{ m['content'] or '' }}\n{% endfor %}{% if add_generation_prompt %}a:"
                  "{% endif %}")


def wide_checkpoint(tokenizer, out: Path, *, chat_template=None, context: int = 256) -> Path:
    """A one-layer model on random weights (seeded) with `tokenizer` and a context of
    `context` tokens: room for a whole JSON reply, which the test suite's trained model (32
    tokens) lacks."""
    import torch

    from tinyt.checkpoint import save_checkpoint
    from tinyt.config import ModelConfig
    from tinyt.model import build_model
    from tinyt.tokenizer import Tokenizer

    torch.manual_seed(0)
    model = build_model(ModelConfig(block_size=context, vocab_size=tokenizer.vocab_size,
                                    n_layer=1, n_head=2, n_embd=32)).eval()
    return save_checkpoint(out, model, Tokenizer(tokenizer.hf, chat_template=chat_template))


def errors(value, schema: dict, root: dict | None = None, where: str = "$") -> list[str]:
    """What makes `value` invalid under `schema` (the subset above: type, properties,
    required, additionalProperties, enum, const, string lengths, numeric bounds, items and
    their count, anyOf, oneOf, allOf, local $ref); [] if it is valid."""
    root = schema if root is None else root
    out: list[str] = []
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#").strip("/").split("/"):
            target = target[part] if part else target
        out += errors(value, target, root, where)
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool,
             "null": type(None)}
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types

        def is_a(t):
            if t == "integer":
                return isinstance(value, int) and not isinstance(value, bool)
            if t == "number":
                return isinstance(value, (int, float)) and not isinstance(value, bool)
            return isinstance(value, kinds[t])
        if not any(is_a(t) for t in types):
            return out + [f"{where}: {json.dumps(value)[:40]} is not of type {types}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} not in enum")
    if "const" in schema and value != schema["const"]:
        out.append(f"{where}: {value!r} != const {schema['const']!r}")
    if isinstance(value, str):
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
            out.append(f"{where}: length {len(value)} outside the bounds")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not schema.get("minimum", value) <= value <= schema.get("maximum", value):
            out.append(f"{where}: {value} outside [minimum, maximum]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{where}: misses {k!r}" for k in schema.get("required", []) if k not in value]
        for k, v in value.items():
            if k in props:
                out += errors(v, props[k], root, f"{where}.{k}")
            elif schema.get("additionalProperties", True) is False:
                out.append(f"{where}: extra property {k!r}")
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            out.append(f"{where}: {len(value)} items outside the bounds")
        if "items" in schema:
            for i, v in enumerate(value):
                out += errors(v, schema["items"], root, f"{where}[{i}]")
    for s in schema.get("allOf", []):
        out += errors(value, s, root, where)
    if "anyOf" in schema and all(errors(value, s, root, where) for s in schema["anyOf"]):
        out.append(f"{where}: matches none of anyOf")
    if "oneOf" in schema and sum(not errors(value, s, root, where)
                                 for s in schema["oneOf"]) != 1:
        out.append(f"{where}: does not match exactly one of oneOf")
    return out


def check(text: str, schema: dict) -> object:
    """The JSON value of `text`, asserted valid under `schema` (by errors() and, where
    installed, by jsonschema)."""
    value = json.loads(text)
    assert errors(value, schema) == [], (text, errors(value, schema))
    try:
        import jsonschema
    except ImportError:
        return value
    jsonschema.validate(value, schema)
    return value
