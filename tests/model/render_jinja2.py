"""Reference renderer for the chat-template parity test: Jinja2 itself, configured the way
Hugging Face transformers' apply_chat_template configures it. Reads a JSON list of cases
{template, messages, add_generation_prompt, bos_token, eos_token, extra} on stdin and prints a
JSON list of {"text": ...} or {"error": ...}."""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

out = []
for case in json.load(sys.stdin):
    try:
        template = env.from_string(case["template"])
        text = template.render(messages=case["messages"],
                               add_generation_prompt=case["add_generation_prompt"],
                               bos_token=case["bos_token"], eos_token=case["eos_token"],
                               **case.get("extra", {}))
        out.append({"text": text})
    except Exception as e:  # noqa: BLE001 - any failure is compared as "raised"
        out.append({"error": str(e)})
json.dump(out, sys.stdout, ensure_ascii=False)
