"""Reference renderer for the Jinja parity tests: Jinja2 itself, set up the way Hugging Face
transformers' apply_chat_template sets it up (ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and loopcontrols; its own tojson filter; raise_exception and strftime_now).

Reads a JSON list of cases on stdin and writes a JSON list of results on stdout, one per case:
{"text": rendered} or {"error": "ExceptionType: message"}. A case is either
  {"template", "messages", "add_generation_prompt", "bos_token", "eos_token", "extra"}
which renders as transformers does (tools and documents default to None; the other extra
variables are passed as they are), or
  {"template", "context"}
which renders the template with the context's members as variables.

Run it with Debian's /usr/bin/python3 and python3-jinja2 (scripts/setup.sh installs them)."""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers replaces Jinja2's tojson (which escapes HTML) with plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, case):
    template = env.from_string(case["template"])
    if "context" in case:
        return template.render(**case["context"])
    extra = dict(case.get("extra", {}))
    tools = extra.pop("tools", None)
    documents = extra.pop("documents", None)
    kwargs = {"bos_token": case["bos_token"], "eos_token": case["eos_token"], **extra}
    return template.render(messages=case["messages"], tools=tools, documents=documents,
                           add_generation_prompt=case["add_generation_prompt"], **kwargs)


def main():
    env = make_env()
    out = []
    for case in json.load(sys.stdin):
        try:
            out.append({"text": render(env, case)})
        except Exception as e:  # noqa: BLE001 - any failure counts as "raised"
            out.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
