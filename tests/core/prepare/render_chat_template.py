#!/usr/bin/python3
"""Renders conversations with a model's own chat template, the way Hugging Face
transformers' apply_chat_template does (Jinja2 in an immutable sandbox,
trim_blocks and lstrip_blocks, the loopcontrols extension, raise_exception and
tojson), so that `dflash-host prepare`'s formats can be checked against the
templates that define them.

    render_chat_template.py TOKENIZER_CONFIG_JSON < cases.json > rendered.json

cases.json: [{"messages": [...], "add_generation_prompt": bool, "enable_thinking": bool or null}, ...]
rendered.json: the rendered strings, in order; null for a case the template
refuses (raise_exception, e.g. Gemma 3's roles that do not alternate).
"""
import json
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox


def token_text(value):
    if isinstance(value, dict):
        return value.get("content")
    return value


class RefusedByTemplate(jinja2.exceptions.TemplateError):
    """What the template's raise_exception raises: it refuses the conversation.
    Any other error is the template's or this script's, and stops it."""


def raise_exception(message):
    raise RefusedByTemplate(message)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        config = json.load(f)
    template = config["chat_template"]
    if isinstance(template, list):
        template = next(t["template"] for t in template if t.get("name") == "default")
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)
    out = []
    for case in json.load(sys.stdin):
        kwargs = {
            "messages": case["messages"],
            "add_generation_prompt": case.get("add_generation_prompt", False),
            "bos_token": token_text(config.get("bos_token")) or "",
            "eos_token": token_text(config.get("eos_token")) or "",
        }
        if case.get("enable_thinking") is not None:
            kwargs["enable_thinking"] = case["enable_thinking"]
        try:
            out.append(compiled.render(**kwargs))
        except RefusedByTemplate:
            out.append(None)
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
