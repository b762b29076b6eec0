#!/usr/bin/python3
"""Renders conversations with a model's own chat template, the way Hugging Face
transformers' apply_chat_template does (Jinja2 in an immutable sandbox,
trim_blocks and lstrip_blocks, the loopcontrols extension, raise_exception,
tojson and strftime_now), so that `dflash-host prepare`'s formats can be
checked against the templates that define them.

    render_chat_template.py TOKENIZER_CONFIG_JSON < cases.json > rendered.json

cases.json: [{"messages": [...], "add_generation_prompt": bool, "enable_thinking": bool or null,
              "date": "YYYY-MM-DD" or absent}, ...]
rendered.json: the rendered strings, in order; null for a case the template
refuses (raise_exception, e.g. Gemma 3's roles that do not alternate).
A case's "date" is what strftime_now renders (gpt-oss's "Current date"), so
that a rendering does not depend on the day it is made; without one it is
today, as in transformers.
"""
import datetime
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


def chat_template(config):
    template = config["chat_template"]
    if isinstance(template, list):
        template = next(t["template"] for t in template if t.get("name") == "default")
    return template


def render_cases(config, cases):
    """The rendered strings of cases (None where the template refuses one)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(chat_template(config))
    out = []
    for case in cases:
        now = (datetime.datetime.strptime(case["date"], "%Y-%m-%d") if case.get("date")
               else datetime.datetime.now())
        kwargs = {
            "messages": case["messages"],
            "add_generation_prompt": case.get("add_generation_prompt", False),
            "bos_token": token_text(config.get("bos_token")) or "",
            "eos_token": token_text(config.get("eos_token")) or "",
            "strftime_now": lambda format, now=now: now.strftime(format),
        }
        if case.get("enable_thinking") is not None:
            kwargs["enable_thinking"] = case["enable_thinking"]
        try:
            out.append(compiled.render(**kwargs))
        except RefusedByTemplate:
            out.append(None)
    return out


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        config = json.load(f)
    json.dump(render_cases(config, json.load(sys.stdin)), sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
