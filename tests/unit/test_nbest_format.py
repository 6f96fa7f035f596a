"""The n-best file formats (`attnlab.inference.nbest.nbest_text`) on hand-made lists: fairseq-generate's
line layout and the JSON Lines object."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import torch

from attnlab.data.tokenizer import EOS_ID
from attnlab.inference.nbest import Candidate, NBest, hard_alignment, nbest_text, soft_alignment

LN2 = math.log(2)


def example(alignment: object) -> NBest:
    ended = Candidate("A dog.", ["▁A", "▁dog.", "</s>"], [7, 9, EOS_ID], -3 * LN2, -2 * LN2,
                      [-LN2, -1.5 * LN2, -0.5 * LN2], alignment)  # fmt: skip
    cut = Candidate("A cat", ["▁A", "▁cat"], [7, 11], -4 * LN2, -3 * LN2, [-LN2, -3 * LN2], None)
    return NBest(3, "Ein Hund.", ["▁Ein", "▁Hund.", "</s>"], [ended, cut], reference="A dog.")


def test_fairseq_lines_follow_fairseq_generate() -> None:
    text = nbest_text(example([(0, 0), (1, 1)]), "fairseq")
    assert text.splitlines() == [
        "S-3\tEin Hund.",
        "T-3\tA dog.",
        "H-3\t-2.0\t▁A ▁dog.",  # normalized score in base 2; the pieces without eos
        "D-3\t-2.0\tA dog.",
        "P-3\t-1.0000 -1.5000 -0.5000",  # one per token, eos's too
        "A-3\t0-0 1-1",
        "H-3\t-3.0\t▁A ▁cat",  # cut at the length limit: every piece
        "D-3\t-3.0\tA cat",
        "P-3\t-1.0000 -3.0000",
    ]
    soft = nbest_text(example([[0.75, 0.25, 0.0], [0.1, 0.8, 0.1], [0.0, 0.0, 1.0]]), "fairseq")
    assert "A-3\t0.750000,0.250000,0.000000 0.100000,0.800000,0.100000 0.000000,0.000000,1.000000" in soft
    assert nbest_text(NBest(0, "", [], []), "fairseq") == "S-0\t\n"  # no source tokens: no hypotheses


def test_fairseq_lines_stay_one_line_each_whatever_breaks_the_source_and_reference_hold() -> None:
    """A raw source or reference line may hold a lone "\\r", U+0085, U+2028 or U+2029 (attnlab splits
    lines at "\\n" only): written as spaces, so that readers splitting on universal newlines (Python's
    text files) or on Unicode line boundaries (`str.splitlines`) read the lines fairseq-generate would."""
    listed = example([(0, 0), (1, 1)])
    broken = NBest(3, "Ein\rHund\u2028und\x85eine\u2029Katze.", listed.source_tokens, listed.hypotheses,
                   reference="A\rdog\u2028.")  # fmt: skip
    text = nbest_text(broken, "fairseq")
    expected = nbest_text(NBest(3, "Ein Hund und eine Katze.", listed.source_tokens, listed.hypotheses,
                                reference="A dog ."), "fairseq")  # fmt: skip
    assert text == expected
    assert io.StringIO(text, newline=None).readlines() == [f"{line}\n" for line in text.split("\n")[:-1]]
    assert len(text.splitlines()) == text.count("\n") == 9
    record = json.loads(nbest_text(broken, "jsonl"))  # JSON Lines: kept as they are, escaped (below)
    assert (record["source"], record["reference"]) == (broken.source, broken.reference)


def test_fairseq_lines_keep_their_fields_whatever_tabs_the_source_reference_and_text_hold() -> None:
    """A tab inside a raw source or reference (or a hypothesis' text) shifted the fields of its line for
    readers that split on tabs, as fairseq's own do (`extract_bt_data.py`: `line.rstrip().split("\\t")[1]`
    took the source up to its first tab): written as a space, the line has the fields fairseq-generate's
    has, and the field separators stay tabs."""
    listed = example([(0, 0), (1, 1)])
    ended = dataclasses.replace(listed.hypotheses[0], text="A\tdog.")
    tabbed = NBest(3, "Ein\tHund.", listed.source_tokens, [ended], reference="A\tdog.")
    fields = [line.rstrip().split("\t") for line in nbest_text(tabbed, "fairseq").splitlines()]
    assert fields == [
        ["S-3", "Ein Hund."],
        ["T-3", "A dog."],
        ["H-3", "-2.0", "▁A ▁dog."],
        ["D-3", "-2.0", "A dog."],
        ["P-3", "-1.0000 -1.5000 -0.5000"],
        ["A-3", "0-0 1-1"],
    ]


def test_json_lines_hold_one_object_per_sentence() -> None:
    text = nbest_text(example([(0, 0), (1, 1)]), "jsonl")
    assert text.endswith("\n") and text.count("\n") == 1 and "▁Hund" in text  # UTF-8, not escaped
    record = json.loads(text)
    assert list(record) == ["index", "source", "source_tokens", "reference", "hypotheses"]
    first, second = record["hypotheses"]
    assert first == {
        "text": "A dog.", "tokens": ["▁A", "▁dog.", "</s>"], "ids": [7, 9, EOS_ID], "score": -3 * LN2,
        "normalized": -2 * LN2, "token_scores": [-LN2, -1.5 * LN2, -0.5 * LN2], "alignment": [[0, 0], [1, 1]],
    }  # fmt: skip
    assert "alignment" not in second
    assert "reference" not in json.loads(nbest_text(NBest(0, "x", [], []), "jsonl"))


def test_a_json_lines_file_reads_one_record_a_line_whatever_breaks_its_text_holds(tmp_path: Path) -> None:
    """JSON leaves U+0085, U+2028 and U+2029 raw in a string (`ensure_ascii=False`): valid JSON, but
    `str.splitlines` and JavaScript's line readers split the record there, and neither half was JSON. They
    are written as their escapes; the text read back is the text written."""
    from attnlab.inference.translator import Evaluation

    listed = example([(0, 0), (1, 1)])
    broken = NBest(3, "Ein\x85Hund\u2028und\u2029Katze.\r\x0b\x1c", listed.source_tokens, listed.hypotheses,
                   reference="A\u2028dog.")  # fmt: skip
    lists = [broken, NBest(4, "Zwei\u2029Hunde.", [], [])]
    Evaluation({"sets": {"test": {"nbest": "nbest/test.jsonl"}}}, {"test": ["A dog.", ""]}, {}, {},
               {"test": lists}).write(tmp_path)  # fmt: skip
    lines = (tmp_path / "nbest" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [n.to_json() for n in lists]
    assert "▁Hund" in lines[0]  # other text stays UTF-8, not escaped


def test_hard_alignment_is_the_argmax_over_source_tokens_without_eos() -> None:
    attention = torch.tensor([[0.2, 0.1, 0.7], [0.1, 0.6, 0.3], [0.5, 0.1, 0.4]])  # (T=3, S=3), eos last
    assert hard_alignment(attention, [7, 9, EOS_ID], EOS_ID) == [(0, 0), (1, 1)]  # row 0: eos ignored
    assert hard_alignment(attention, [7, 9, 11], EOS_ID) == [(0, 0), (1, 1), (0, 2)]
    assert soft_alignment(attention / 3)[0] == [0.066667, 0.033333, 0.233333]
    assert hard_alignment(torch.ones(2, 1), [7, EOS_ID], EOS_ID) == []  # a source of eos alone: no pairs


def test_an_evaluation_written_again_leaves_no_earlier_nbest_file_of_its_sets(tmp_path: Path) -> None:
    from attnlab.inference.translator import Evaluation

    def evaluation(nbest: bool, nbest_format: str = "jsonl") -> Evaluation:
        sets = {
            "test": {"nbest": f"nbest/test.{'jsonl' if nbest_format == 'jsonl' else 'txt'}"} if nbest else {}
        }
        return Evaluation({"sets": sets}, {"test": ["A dog."]}, {"test": ["A dog."]}, {"test": ["Ein Hund."]},
                          {"test": [example(None)]} if nbest else {}, nbest_format)  # fmt: skip

    evaluation(True).write(tmp_path)
    (tmp_path / "nbest" / "other.jsonl").write_text("a set not scored again\n")
    assert (tmp_path / "nbest" / "test.jsonl").is_file()
    evaluation(True, "fairseq").write(tmp_path)
    assert not (tmp_path / "nbest" / "test.jsonl").exists() and (tmp_path / "nbest" / "test.txt").is_file()
    evaluation(False).write(tmp_path)  # results.json names no n-best file: none of test's is left
    assert not (tmp_path / "nbest" / "test.txt").exists() and not (tmp_path / "nbest" / "test.jsonl").exists()
    assert (tmp_path / "nbest" / "other.jsonl").read_text() == "a set not scored again\n"
