"""The content of `results.json` (`attnlab.runs.layout.RunDir.write_results` writes it) and its table."""

from __future__ import annotations

import json
from typing import Any


def results_bytes(results: dict[str, Any]) -> bytes:
    """The content of `results.json` for `results`."""
    return (json.dumps(results, indent=2, sort_keys=True) + "\n").encode("utf-8")


def decoding_summary(results: dict[str, Any]) -> str:
    """One line saying how `results.json`'s translations were decoded: search or sampling settings, and
    the checkpoints (one, averaged, or an ensemble)."""
    decode = results.get("decode") or {}
    if decode.get("sampling"):
        how = (f"sampling (topk {decode.get('topk')}, topp {decode.get('topp')}, temperature "
               f"{decode.get('temperature')}, seed {decode.get('seed')})")  # fmt: skip
    elif decode.get("beam") == 1:
        how = "greedy"
    else:
        penalty = decode.get("length_penalty", "gnmt")
        alpha = decode.get("alpha", decode.get("lenpen"))  # (results of older versions: lenpen)
        how = f"beam {decode.get('beam')}, {penalty} length penalty alpha {alpha}"
    checkpoints = results.get("checkpoints") or []
    if results.get("ensemble"):
        source = f"ensemble of {len(results['ensemble'])}: {', '.join(results['ensemble'])}"
    elif results.get("averaged"):
        source = f"average of {len(checkpoints)}: {', '.join(checkpoints)}"
    else:
        source = ", ".join(checkpoints) or "-"
    return f"decoding: {how}; checkpoints: {source}"


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
