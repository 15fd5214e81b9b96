"""The dataset and the generation scores of the incontext_facts_tiny tasks: facts_tiny.jsonl next to this file, read
without network or dataset cache."""

import json
from pathlib import Path


def load(**_):
    """lm-eval's custom_dataset hook: the questions as one `test` split (the task's metadata keywords are ignored)."""
    import datasets

    lines = (Path(__file__).parent / "facts_tiny.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def process_generation(doc, results):
    """exact_match: the answer, stripped, is the gold choice; contains: the gold choice appears in it, case aside."""
    answer, gold = results[0].strip(), doc["choices"][doc["answer"]]
    return {"exact_match": float(answer == gold), "contains": float(gold.lower() in answer.lower())}
