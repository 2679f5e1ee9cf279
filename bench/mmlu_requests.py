#!/usr/bin/env python3
"""Real MMLU 5-shot prompts as an OpenAI Batch file, in DFS order (subject by subject).

    bench/mmlu_requests.py MMLU_DIR OUT.jsonl [--subjects N] [--per-subject M] [--max-tokens K]

MMLU_DIR holds dev/ and test/ CSVs (hendrycks/test layout: question, A, B, C, D, answer; no
header), e.g. data/traces/mmlu in the repository. Prompts are built as the repository's evaluate.py
builds them: a header naming the subject, the subject's 5 dev examples with answers, then the
test question ending in "Answer:". Every question of a subject shares the header and examples,
the long shared prefix of the papers' few-shot workloads. Standard library only.
"""
import argparse
import csv
import json
import os


def example(row, with_answer):
    text = row[0]
    for letter, choice in zip("ABCD", row[1:5]):
        text += f"\n{letter}. {choice}"
    text += "\nAnswer:"
    if with_answer:
        text += f" {row[5]}\n\n"
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mmlu_dir")
    ap.add_argument("out")
    ap.add_argument("--subjects", type=int, default=8)
    ap.add_argument("--per-subject", type=int, default=25)
    ap.add_argument("--max-tokens", type=int, default=1)
    a = ap.parse_args()
    subjects = sorted(f[: -len("_test.csv")] for f in os.listdir(os.path.join(a.mmlu_dir, "test")))
    n = 0
    with open(a.out, "w") as out:
        for subject in subjects[: a.subjects]:
            with open(os.path.join(a.mmlu_dir, "dev", f"{subject}_dev.csv"), newline="") as f:
                dev = list(csv.reader(f))[:5]
            with open(os.path.join(a.mmlu_dir, "test", f"{subject}_test.csv"), newline="") as f:
                test = list(csv.reader(f))[: a.per_subject]
            header = ("The following are multiple choice questions (with answers) about "
                      f"{subject.replace('_', ' ')}.\n\n")
            shots = "".join(example(r, True) for r in dev)
            for i, row in enumerate(test):
                body = {"model": "mmlu", "prompt": header + shots + example(row, False),
                        "max_tokens": a.max_tokens, "temperature": 0}
                out.write(json.dumps({"custom_id": f"{subject}-{i}", "method": "POST",
                                      "url": "/v1/completions", "body": body}) + "\n")
                n += 1
    print(f"wrote {n} requests to {a.out}")


if __name__ == "__main__":
    main()
