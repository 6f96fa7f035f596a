"""`results.json` and the files an evaluation writes beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlab.io import atomic_write_bytes

RESULTS_FILE = "results.json"


HYPOTHESES_DIR = "hypotheses"


REFERENCES_DIR = "references"


def write_results(output_dir: str | Path, results: dict[str, Any]) -> Path:
    """Write `results.json` atomically (a reader never sees half a file)."""
    path = Path(output_dir) / RESULTS_FILE
    atomic_write_bytes(path, results_bytes(results))
    return path


def results_bytes(results: dict[str, Any]) -> bytes:
    """The content of `results.json` for `results`."""
    return (json.dumps(results, indent=2, sort_keys=True) + "\n").encode("utf-8")


def results_table(results: dict[str, Any]) -> str:
    """The scores of `results.json` as a text table (one row per set)."""
    rows = [("set", "sentences", "BLEU", "chrF", "signature")]
    for name, entry in results["sets"].items():
        rows.append((name, str(entry["sentences"]), f"{entry['bleu']:.2f}", f"{entry['chrf']:.2f}",
                     entry["bleu_signature"]))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
