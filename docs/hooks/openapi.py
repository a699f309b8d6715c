"""MkDocs hook: the HTTP reference, rendered from the server's own OpenAPI document.

The document comes from `create_app().openapi()` at build time, so the reference cannot drift
from the code; it is also published beside the page as `reference/openapi.json`.
"""

from __future__ import annotations

import json
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

PAGE = "reference/http.md"
DOCUMENT = "reference/openapi.json"
METHODS = ("get", "put", "post", "delete", "patch")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    from execbox.server.app import create_app

    document = create_app().openapi()
    files.append(File.generated(config, PAGE, content=render(document)))
    files.append(File.generated(config, DOCUMENT, content=json.dumps(document, indent=2)))
    return files


def render(document: dict[str, Any]) -> str:
    info = document["info"]
    lines = [
        "# HTTP API reference",
        "",
        f"execbox {info['version']}, OpenAPI {document['openapi']}. {info.get('description', '')}",
        "",
        "Generated from the server's OpenAPI document when the docs are built; the document "
        "itself is [openapi.json](openapi.json). A running server serves it at "
        "`/openapi.json` only under `execbox serve --docs`. How the service behaves (keys, "
        "quotas, errors) is in [HTTP service and keys](../service.md).",
        "",
    ]
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                lines += _operation(method, path, item[method])
    lines += ["## Schemas", ""]
    for name, schema in sorted(document["components"]["schemas"].items()):
        lines += _schema(name, schema)
    return "\n".join(lines) + "\n"


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    lines = [f"## `{method.upper()} {path}`", "", op.get("summary", ""), ""]
    if op.get("description"):
        lines += [op["description"], ""]
    lines.append("Needs a key." if op.get("security") else "No key.")
    lines.append("")
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required |", "|---|---|---|---|"]
        for p in params:
            kind = _type(p.get("schema", {}))
            lines.append(f"| `{p['name']}` | {p['in']} | {kind} | {_yes(p.get('required'))} |")
        lines.append("")
    body = op.get("requestBody")
    if body:
        kinds = ", ".join(f"`{c}` {_type(v.get('schema', {}))}" for c, v in body["content"].items())
        lines += [f"Body: {kinds}.", ""]
    lines += ["| status | answer |", "|---|---|"]
    for status, answer in op.get("responses", {}).items():
        content = answer.get("content", {})
        kinds = ", ".join(
            f"`{c}` {_type(v.get('schema', {}))}".rstrip() for c, v in content.items()
        )
        lines.append(
            f"| {status} | {answer.get('description', '')}{': ' + kinds if kinds else ''} |"
        )
    return [*lines, ""]


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [" ".join(schema["description"].split()), ""]
    if "enum" in schema:
        return [*lines, "One of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".", ""]
    props = schema.get("properties", {})
    if not props:
        return [*lines, f"Type: {_type(schema)}.", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | description |", "|---|---|---|---|"]
    for field, spec in props.items():
        text = " ".join(str(spec.get("description", "")).split()).replace("|", "\\|")
        lines.append(f"| `{field}` | {_type(spec)} | {_yes(field in required)} | {text} |")
    return [*lines, ""]


def _type(schema: dict[str, Any]) -> str:
    """A schema's type in a few words, its references as links to the schemas' headings."""
    if "$ref" in schema:
        target = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{target}](#{target.lower()})"
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " or ".join(_type(s) for s in schema[key])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {_type(schema['additionalProperties'])}"
    return str(kind)


def _yes(flag: object) -> str:
    return "yes" if flag else ""
