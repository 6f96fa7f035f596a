"""The content of `results.json` (`attnlab.runs.layout.RunDir.write_results` writes it) and its table."""

from __future__ import annotations

import json
from typing import Any


def results_bytes(results: dict[str, Any]) -> bytes:
    """The content of `results.json` for `results`."""
    return (json.dumps(results, indent=2, sort_keys=True) + "\n").encode("utf-8")


def results_table(results: dict[str, Any]) -> str:
    """The scores of `results.json` as a text table (one row per set): sacreBLEU, chrF, TER, the paper's
    tokenized compound-split BLEU (not comparable to sacreBLEU) and the BLEU signature ("-" for a score a
    results file from an older attnlab lacks)."""

    def score(entry: dict[str, Any], key: str) -> str:
        return "-" if entry.get(key) is None else f"{entry[key]:.2f}"

    rows = [("set", "sentences", "BLEU", "chrF", "TER", "BLEU tok+compound (paper)", "signature")]
    for name, entry in results["sets"].items():
        rows.append((name, str(entry["sentences"]), score(entry, "bleu"), score(entry, "chrf"),
                     score(entry, "ter"), score(entry, "bleu_tok_compound"),
                     entry["bleu_signature"]))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
