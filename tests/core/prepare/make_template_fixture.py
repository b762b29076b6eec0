#!/usr/bin/python3
"""Saves what a chat template renders, for a template this repository may not
hold (gpt-oss's): its conversations, each rendered as a training line and as
the prompt before its last message, with where the template came from. The
chat-format tests compare `prepare`'s formats to these renderings as they do
to the templates they can render themselves (render_chat_template.py, which
renders these too).

    make_template_fixture.py TEMPLATE.jinja FIXTURE.json --source URL --date YYYY-MM-DD
        [--conversations CONVERSATIONS.json] [--note TEXT]

CONVERSATIONS.json: [[{"role": ..., "content": ..., "thinking": ...}, ...], ...];
without it, the conversations already in FIXTURE.json are rendered again
(after the template changes, say). --date is the template's strftime_now, so
that a fixture does not depend on the day it was made.
"""
import argparse
import hashlib
import json

from render_chat_template import render_cases


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("template")
    parser.add_argument("fixture")
    parser.add_argument("--source", required=True, help="where the template was read: a URL at a commit")
    parser.add_argument("--date", required=True, help="what strftime_now renders, YYYY-MM-DD")
    parser.add_argument("--conversations", help="JSON list of conversations (default: the fixture's)")
    parser.add_argument("--note", default="", help="anything else a reader should know about the template")
    args = parser.parse_args()
    with open(args.template, encoding="utf-8") as f:
        template = f.read()
    if args.conversations:
        with open(args.conversations, encoding="utf-8") as f:
            conversations = json.load(f)
    else:
        with open(args.fixture, encoding="utf-8") as f:
            conversations = [case["messages"] for case in json.load(f)["cases"]]
    cases = []
    for messages in conversations:
        cases.append({"messages": messages, "add_generation_prompt": False, "date": args.date})
        cases.append({"messages": messages[:-1], "add_generation_prompt": True, "date": args.date})
    rendered = render_cases({"chat_template": template}, cases)
    fixture = {
        "comment": "Made by tests/core/prepare/make_template_fixture.py: each conversation rendered by the chat "
                   "template below with Jinja2 as transformers renders it, as a training line (\"training\") and as "
                   "the prompt before its last message (\"prompt\", add_generation_prompt); null where the template "
                   "refuses. The template itself is not kept here.",
        "template": {"source": args.source, "sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
                     "note": args.note},
        "date": args.date,
        "cases": [{"messages": messages, "training": rendered[2 * i], "prompt": rendered[2 * i + 1]}
                  for i, messages in enumerate(conversations)],
    }
    with open(args.fixture, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
