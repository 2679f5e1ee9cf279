#!/usr/bin/env python3
"""Checks structured outputs with a real JSON-schema validator (Debian's python3-jsonschema).

Input: a JSON file holding a list of {"schema": SCHEMA or null, "text": OUTPUT}; null means
response_format json_object (any JSON object). Prints "valid N/M" and exits 1 unless all are.
"""
import json
import sys

import jsonschema


def main():
    cases = json.load(open(sys.argv[1], encoding="utf-8"))
    bad = []
    for i, case in enumerate(cases):
        try:
            value = json.loads(case["text"])
            if case["schema"] is None:
                if not isinstance(value, dict):
                    raise ValueError("not an object")
            else:
                jsonschema.Draft202012Validator(case["schema"]).validate(value)
        except Exception as e:  # noqa: BLE001 - any failure is reported with its case
            bad.append((i, str(e)[:200], case["text"][:200]))
    print(f"valid {len(cases) - len(bad)}/{len(cases)}")
    for i, err, text in bad[:10]:
        print(f"case {i}: {err}\n  {text!r}")
    sys.exit(1 if bad or not cases else 0)


if __name__ == "__main__":
    main()
