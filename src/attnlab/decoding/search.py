"""Autoregressive decoding over the incremental K/V cache: greedy and beam search, and `translate`, the
one entry point that decodes with a `DecodeConfig` (training's validation decodes and `Translator` use it),
and `nbest_decode`, the same decode as n-best hypotheses with scores (and cross-attention).

Notation: `B` batch, `K` beam size, `S` source length, `T` output length, `V` vocabulary size.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from attnlab.data.text import plural
from attnlab.decoding.settings import DecodeConfig
from attnlab.decoding.step import FIRST_POSITIONS, decoding_step
from attnlab.model.config import TransformerConfig
from attnlab.model.transformer import Transformer
from attnlab.typed import ConfigError

try:
    import resource  # Unix only
except ImportError:  # pragma: no cover
    resource = None

MAX_OUTPUT_TOKENS = 4096  # the longest output of a model without a position limit (sinusoidal encodings)


def max_output_lengths(src: Tensor, pad_id: int, a: float, b: int, limit: int | None = None) -> Tensor:
    """Longest output allowed for each sentence (B,): a · |S| + b rounded down, |S| its non-pad source
    length, at least 1 and at most `limit` (a model's `TransformerConfig.position_limit`: each decoder
    input needs a position), or `MAX_OUTPUT_TOKENS` for a model without one.

    Per sentence, so that a sentence decodes the same alone as inside a padded batch. In float64 on the
    CPU (MPS has no float64), as Python computes `int(a * len + b)` (`max_output_length`, which
    `attnlab.interop.ct2` groups sentences by): float32 came out one token off for some a and |S| (a = 1.3,
    |S| = 90: 126 instead of 127).
    """
    lengths = (src != pad_id).sum(dim=1).to("cpu", torch.float64) * a + b
    return lengths.clamp(min=1, max=output_cap(limit)).long().to(src.device)


def output_cap(limit: int | None) -> int:
    """The longest output of a model with position limit `limit` (`TransformerConfig.position_limit`):
    `limit`, or `MAX_OUTPUT_TOKENS` when it has none."""
    return MAX_OUTPUT_TOKENS if limit is None else limit


def max_output_length(source_length: int, a: float, b: int, limit: int | None = None) -> int:
    """`max_output_lengths` of one source of `source_length` tokens (eos included), as a Python int: the
    same arithmetic (Python floats are float64) for the exports, which decode outside PyTorch."""
    return int(min(max(1.0, a * source_length + b), output_cap(limit)))  # (a·|S| may overflow to inf)


class NonFiniteScores(ValueError):
    """Decoding met next-token scores that are NaN (or +inf): no output of the model means anything."""


def non_finite_scores(search: str, count: int, batch: int, first: int) -> NonFiniteScores:
    """The error of `search` (greedy decoding, beam search) for `count` of `batch` sentences, the first
    `first`, whose scores were NaN, naming the cause."""
    return NonFiniteScores(
        f"{search} found no hypothesis for {count} of {batch} sentences (the first: {first}): the model's "
        "scores are NaN, so its weights or inputs hold NaN or infinite values, or values so large that its "
        "activations overflow"
    )


def ungenerable_ids(config: TransformerConfig, device: torch.device) -> Tensor:
    """The ids no decoder ever outputs: pad, bos and the decoder start id (made once per decode call)."""
    return torch.tensor(sorted({config.pad_id, config.bos_id, config.start_id}), device=device)


def decoder_mask(src_mask: Tensor) -> Tensor | None:
    """The source mask (B, S) a search's decoding steps take: None when no source has padding, so
    cross-attention runs without a mask (the same outputs, single sentences decode about 5% faster:
    docs/benchmarks.md). One check per search, not per step."""
    return None if bool(src_mask.all()) else src_mask


def mask_ungenerable(scores: Tensor, never: Tensor, eos_id: int, length: int, min_len: int) -> Tensor:
    """Set to -inf, in place, the scores (N, V) of ids no decoder may output at this step: `never`
    (`ungenerable_ids`) always, eos while an output of `length` tokens (this one included) would be
    shorter than `min_len`. Greedy decoding and beam search both go through it, so beam 1 is greedy."""
    scores[:, never] = -math.inf
    if length < min_len:
        scores[:, eos_id] = -math.inf
    return scores


@dataclass(frozen=True)
class Sampling:
    """How `greedy_decode` draws tokens instead of taking the most probable one (`DecodeConfig.sampling`).

    Each sentence draws from its own `torch.Generator`, seeded from `seed` and its non-pad source ids
    (`generators`), one uniform number per step, so a sentence samples the same alone as inside any
    batch and in any order (up to floating-point rounding of batched arithmetic at a boundary between
    two tokens), and identical sources sample identically.

    Attributes:
        topk: Draw among the k most probable tokens (0: all; 1: greedy).
        topp: Draw among the most probable tokens whose probabilities sum to p, the most probable always
            kept (1.0: all).
        temperature: The logits are divided by it first.
        seed: Seed of the draws.
    """

    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.topk < 0 or not 0 < self.topp <= 1 or not 0 < self.temperature < math.inf:
            raise ValueError(f"topk={self.topk} must be >= 0, topp={self.topp} in (0, 1] and temperature="
                             f"{self.temperature} > 0 and finite")  # fmt: skip

    @classmethod
    def of(cls, config: DecodeConfig) -> Sampling:
        return cls(config.topk, config.topp, config.temperature, config.seed)

    def generators(self, src: Tensor, pad_id: int) -> list[torch.Generator]:
        """One generator per sentence of `src` (B, S), seeded from `seed` and the sentence's ids."""
        out = []
        for row in src.tolist():
            ids = [t for t in row if t != pad_id]
            digest = hashlib.blake2b(repr((self.seed, ids)).encode(), digest_size=8).digest()
            out.append(torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1))
        return out

    def pick(self, scores: Tensor, generators: list[torch.Generator]) -> Tensor:
        """One token (N, 1) per row of `scores` (N, V) (-inf where not allowed), row i drawn with
        `generators[i]` from softmax(scores / temperature) (in float64) restricted to the `topk` most
        probable tokens and to the nucleus of mass `topp` (ties ranked in id order, so `topk=1` keeps
        `argmax`'s token), by inverse transform of one uniform draw over the kept tokens in id order:
        a draw does not hinge on how near-equal probabilities happen to sort."""
        scores = scores.double()
        # shifted first: a tiny temperature would otherwise overflow finite scores to inf (softmax: NaN)
        probs = ((scores - scores.amax(dim=-1, keepdim=True)) / self.temperature).softmax(dim=-1)  # (N, V)
        if self.topk > 0 or self.topp < 1:
            sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # (N, V)
            ranked = torch.ones_like(sorted_probs, dtype=torch.bool)
            if self.topk > 0:
                ranked[:, self.topk :] = False
            if self.topp < 1:
                ranked &= (sorted_probs.cumsum(dim=-1) - sorted_probs) < self.topp  # mass before it < p
            ranked[:, 0] = True
            probs = probs * torch.zeros_like(ranked).scatter(1, order, ranked)
        mass = probs.cumsum(dim=-1)  # (N, V)
        u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
        u = u.to(mass.device) * mass[:, -1]  # (N,) in [0, kept mass)
        token = (mass <= u[:, None]).sum(dim=-1).clamp(max=probs.size(-1) - 1)  # the first with mass > u
        return token[:, None]


@torch.inference_mode()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    *,
    max_len_a: float = 1.0,
    max_len_b: int = 10,
    min_len: int = 1,
    use_cache: bool = True,
    sample: Sampling | None = None,
) -> Tensor:
    """Pick the most probable token at each step (or draw one, with `sample`) until every sentence has
    produced eos.

    Pad and the bos/start ids are never picked, eos not before `min_len` (`mask_ungenerable`, as in
    beam search, so `beam_search(beam=1, alpha=0)` gives the same outputs).

    A sentence leaves the batch (and the cache) once it has produced eos or reached its length limit,
    so the remaining steps cost only the sentences still being decoded.

    Args:
        model: The Transformer (its mode is left unchanged; call `.eval()` first for inference).
        src: Source ids (B, S), padded with the model's pad id.
        max_len_a: Output length limit a in a · |S| + b (per sentence, eos included).
        max_len_b: Output length limit b.
        min_len: Shortest output, eos included.
        use_cache: Feed one token per step over the K/V cache (the default); False re-runs the decoder
            over the whole prefix at every step (the same result, slower; for benchmarks and tests).
        sample: Draw each token as `Sampling.pick` says instead of taking the most probable one; the
            masking (pad, bos, eos before `min_len`) and stopping are the same.

    Returns:
        Output ids (B, T) without the start token, eos included, padded with pad after eos.

    Raises:
        ValueError: `min_len` < 1.
        ConfigError: On the CPU, its first step or a later growth of its keys and values buffers needs more
            memory than this process can take (`check_beam_memory`, as beam search's), before it allocates.
        NonFiniteScores: A sentence's scores are NaN (or +inf): NaN or infinite weights or inputs.
    """
    if min_len < 1:
        raise ValueError(f"min_len={min_len} must be >= 1 (the length counts eos)")
    cfg = model.config
    batch = src.size(0)
    limits = max_output_lengths(src, cfg.pad_id, max_len_a, max_len_b, cfg.position_limit)  # (B,)
    longest = int(limits.max())
    if src.device.type == "cpu":
        check_beam_memory(batch, 1, *_first_step_floats(model, longest), _decode_fix(batch, 1))
    memory, src_mask = model.encode(src)
    src_mask = decoder_mask(src_mask)
    out = torch.full((batch, longest), cfg.pad_id, dtype=torch.long, device=src.device)
    decoder = decoding_step(model, memory, src_mask, capacity=longest, use_cache=use_cache,
                            memory_check=functools.partial(_check_growth, 1))  # fmt: skip
    alive = torch.arange(batch, device=src.device)  # the sentence each decoder row belongs to
    token = torch.full((batch, 1), cfg.start_id, dtype=torch.long, device=src.device)
    prefix = token
    never = ungenerable_ids(cfg, src.device)
    generators = None if sample is None else sample.generators(src, cfg.pad_id)  # one per sentence
    seen: list[
        tuple[Tensor, Tensor]
    ] = []  # each step's best scores and their sentences (`_refuse_non_finite`)
    for step in range(out.size(1)):
        logits = decoder(token if use_cache else prefix)  # (B', 1 | t, V)
        scores = mask_ungenerable(logits[:, -1].float(), never, cfg.eos_id, step + 1, min_len)  # (B', V)
        # the first most probable id, as `argmax` (ties: the lowest id); `max` finds it 2.2x faster on the
        # CPU (64 x 5,000 scores: 0.13 against 0.28 ms; docs/benchmarks.md). A NaN score is the max (max
        # propagates NaN): `_refuse_non_finite` refuses it once the search ends (picked, its id made empty
        # or wrong outputs silently); kept here without an operation a step.
        best = scores.max(dim=-1, keepdim=True)
        token = best.indices  # (B', 1)
        seen.append((best.values, alive))
        if generators is not None:
            token = sample.pick(scores, [generators[i] for i in alive.tolist()])  # (B', 1)
        out[alive, step] = token.squeeze(1)
        if not use_cache:
            prefix = torch.cat([prefix, token], dim=1)
        finished = (token.squeeze(1) == cfg.eos_id) | (limits <= step + 1)  # (B',)
        if bool(finished.any()):  # finished sentences leave the batch
            keep = (~finished).nonzero().squeeze(1)
            if keep.numel() == 0:
                _refuse_non_finite(seen, batch)
                return out[:, : step + 1]
            alive, token, limits = alive[keep], token[keep], limits[keep]
            if not use_cache:
                prefix = prefix[keep]
            decoder.reorder(keep, keep)
    _refuse_non_finite(seen, batch)
    return out


def _refuse_non_finite(seen: list[tuple[Tensor, Tensor]], batch: int) -> None:
    """Raise `NonFiniteScores` when a step's best score of a sentence was NaN or +inf: `seen` holds each
    step's best scores (B', 1) with the sentence of each row (B',), checked once per search (a check a step
    made single-sentence greedy decoding 2% slower)."""
    values = torch.cat([v for v, _ in seen]).squeeze(1)
    bad = ~(values < math.inf)  # NaN or +inf
    if bool(bad.any()):
        sentences = sorted(set(torch.cat([rows for _, rows in seen])[bad].tolist()))
        raise non_finite_scores("greedy decoding", len(sentences), batch, sentences[0])


@dataclass
class Hypothesis:
    """One finished beam-search output.

    Attributes:
        tokens: Output ids, eos included if produced, no start token.
        score: Sum of the tokens' log-probabilities (natural log).
        normalized: `score / length_penalty(len(tokens), alpha, penalty)`, the key hypotheses are
            ranked by.
        attention: (len(tokens), S_real) last-decoder-layer cross-attention averaged over heads, over the
            sentence's non-pad source positions; only when `need_attention` was asked for.
        token_scores: Each token's log-probability (len(tokens),), summing to `score`; only when
            `need_token_scores` was asked for (empty otherwise).
    """

    tokens: list[int]
    score: float
    normalized: float
    attention: Tensor | None = None
    token_scores: list[float] = field(default_factory=list)


def length_penalty(length: int, alpha: float, penalty: str = "gnmt") -> float:
    """The length penalty lp(Y) a hypothesis' log-probability is divided by, |Y| = `length` (its tokens,
    eos included): `gnmt` ((5 + |Y|) / 6)^α (Wu et al. 2016, eq. 14) or `fairseq` |Y|^α (fairseq's
    `--lenpen`: its `finalize_hypos` divides by (step + 1)^lenpen, the tokens with eos). α = 0 gives 1.

    Both grow with |Y| for α >= 0, which `_Kept.is_done`'s bound relies on.
    """
    if penalty == "gnmt":
        return ((5 + length) / 6) ** alpha
    if penalty == "fairseq":
        return float(length) ** alpha
    raise ValueError(f"length_penalty={penalty!r} is not a length penalty: use gnmt or fairseq")


class _Kept:
    """The best `beam` finished hypotheses of one sentence, best first (ties keep the earlier one), of
    which the search returns the best `needed` (its `n_best`)."""

    def __init__(self, beam: int, alpha: float, penalty: str, needed: int) -> None:
        self.beam, self.alpha, self.penalty, self.needed = beam, alpha, penalty, needed
        self.hyps: list[Hypothesis] = []

    def add(
        self, tokens: list[int], score: float, attention: Tensor | None, token_scores: list[float]
    ) -> None:
        normalized = score / length_penalty(len(tokens), self.alpha, self.penalty)
        self.hyps.append(Hypothesis(tokens, score, normalized, attention, token_scores))
        self.hyps.sort(key=lambda h: -h.normalized)  # stable
        del self.hyps[self.beam :]

    def is_done(self, best_live: float, max_len: int) -> bool:
        """No live beam can beat the `needed`-th best kept hypothesis any more, so the `needed` best are
        final: whatever the search would still finish ranks below them.

        Log-probs are <= 0, so a live score only decreases; both penalties grow with the length (α >= 0),
        so with α > 0 the best normalized score a live beam could still reach is at most
        best_live / lp(max_len) (Hugging Face's check). A hypothesis finished later that ties the
        `needed`-th would rank after it (ties keep the earlier one), so stopping changes nothing returned.
        """
        if len(self.hyps) < self.needed:
            return False
        worst = self.hyps[self.needed - 1].normalized
        if self.alpha == 0:
            return best_live < worst
        return best_live / length_penalty(max_len, self.alpha, self.penalty) <= worst


# `top_candidates`' chunk width: 2.2× faster than `topk` for 64 × 25,000 candidates (0.51 vs 1.12 ms) and
# 1.3× for 64 × 5,000 on a 2-core Xeon (docs/benchmarks.md); below `_CHUNKED_FROM` chunks per candidate
# kept, `topk` itself
_CHUNK = 64
_CHUNKED_FROM = 4


def top_candidates(scores: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """`scores.topk(n, dim=1)` of (R, N) scores: the n best of each row, best first, and their columns.

    On the CPU, for rows of many candidates (beam search's K·V), as the n best of far fewer: each row's
    columns are cut into chunks of `_CHUNK`, and only the n chunks with the highest maxima (and the
    columns past the last whole chunk) can hold the row's n best. (An element outside them is below n
    chunk maxima, n other elements: it is not among the n best.) The same values as `topk`, and the same
    columns but where scores tie exactly (which of two equal scores ranks first is `topk`'s own choice
    either way).
    """
    rows, width = scores.shape
    chunks = width // _CHUNK
    if scores.device.type != "cpu" or chunks < _CHUNKED_FROM * n:
        return scores.topk(n, dim=1)
    whole = chunks * _CHUNK
    best = scores.narrow(1, 0, whole).view(rows, chunks, _CHUNK).amax(dim=2).topk(n, dim=1).indices  # (R, n)
    columns = (best[:, :, None] * _CHUNK + torch.arange(_CHUNK, device=scores.device)).view(rows, -1)
    if whole < width:  # the columns past the last whole chunk are candidates too
        tail = torch.arange(whole, width, device=scores.device).expand(rows, width - whole)
        columns = torch.cat([columns, tail], dim=1)
    values, picked = scores.gather(1, columns).topk(n, dim=1)
    return values, columns.gather(1, picked)


def _meminfo_available() -> int | None:
    """`MemAvailable` of Linux's `/proc/meminfo` in bytes, or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom(
    membership: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Bytes this process's memory cgroup may still take before its own out-of-memory killer fires (a
    container's or a job scheduler's limit), or None where it has no limit: the limit less the usage, less
    the inactive file cache the kernel reclaims first (as `docker stats` counts). cgroup v1
    (`memory.limit_in_bytes`, `memory.usage_in_bytes` under `root`/memory) or v2 (`memory.max`,
    `memory.current`), the cgroup read from `membership`."""
    try:
        lines = [line.split(":", 2) for line in membership.read_text(encoding="ascii").splitlines()]
        v1 = [path for _, names, path in lines if "memory" in names.split(",")]
        if v1:
            directory = root / "memory" / v1[0].lstrip("/")
            files, inactive = ("memory.limit_in_bytes", "memory.usage_in_bytes"), "total_inactive_file"
        else:
            v2 = [path for number, _, path in lines if number == "0"]
            if not v2:
                return None
            directory = root / v2[0].lstrip("/")
            files, inactive = ("memory.max", "memory.current"), "inactive_file"
        limit = (directory / files[0]).read_text().strip()
        if limit == "max" or int(limit) >= 1 << 62:  # v1 writes "no limit" as a number near 2^63
            return None
        stat = dict(line.split() for line in (directory / "memory.stat").read_text().splitlines())
        used = int((directory / files[1]).read_text()) - int(stat.get(inactive, 0))
        return max(0, int(limit) - used)
    except (OSError, ValueError):
        return None


def _address_space_headroom() -> int | None:
    """Bytes of address space left under this process's `RLIMIT_AS` (`ulimit -v`), or None without one."""
    if resource is None:
        return None
    try:
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/statm", encoding="ascii") as statm:
            size = int(statm.read().split()[0]) * resource.getpagesize()
        return max(0, limit - size)
    except (OSError, ValueError, IndexError):
        return None


def available_memory() -> int | None:
    """Bytes of memory this process can still take: the least of what the kernel reports available
    (`MemAvailable`), its cgroup's headroom (`memory.max` less `memory.current`) and its address space
    left under `ulimit -v`, those that are known; None where none is (other systems than Linux)."""
    known = [
        b for b in (_meminfo_available(), _cgroup_headroom(), _address_space_headroom()) if b is not None
    ]
    return min(known) if known else None


# A first step this small is not checked: reading the limits took 39 µs a call, and no process that runs
# attnlab at all has less memory left than this
_SURELY_FITS = 1 << 26  # 64 MiB


def check_beam_memory(
    sentences: int, beam: int, row_floats: int, what: str, fix: str, when: str = "at its first step"
) -> None:
    """A ConfigError unless a beam search's first step, `sentences` × `beam` rows of `row_floats` float32
    numbers each (`what` says which), fits in `available_memory()`; `fix` is the message's advice. With
    `when` (e.g. "more at step 65"), what a later step needs on top of what the search holds.

    A lower bound of what the search holds, so that it never refuses a search that would fit: a legal but
    huge beam (10^6, 2^31-1, in a config or an export) is refused before anything is allocated, instead of
    allocating until the out-of-memory killer ends this process or another one. The CPU beam search checks
    again whenever its keys and values double (`StepDecoder.memory_check`, `ModuleStep`'s over the
    modules' cache: they grow with the output: at 512 positions, 32 times the keys and values of the first
    step's 16), before they are allocated, with the cross-attention it keeps of as many more outputs when
    asked for it (alignments); so does greedy decoding (`beam` 1: the message names greedy decoding). Where
    the memory is not known, nothing is checked; an accelerator's allocator raises its own out-of-memory
    error.
    """
    needed = 4 * sentences * beam * row_floats
    if needed <= _SURELY_FITS:  # no files read for the usual beams (beam search runs per batch)
        return
    available = available_memory()
    if available is not None and needed > available:
        search = f"beam={beam}" if beam > 1 else "greedy decoding"
        raise ConfigError(
            f"{search} for {sentences} {plural(sentences, 'sentence')} needs at least "
            f"{needed / 2**30:,.1f} GiB {when} "
            f"({sentences} × {beam} rows of {row_floats} float32 numbers: {what}), more than the "
            f"{available / 2**30:,.1f} GiB of memory this process can take: {fix}"
        )


def _first_step_floats(model: Transformer, capacity: int, source: int = 0) -> tuple[int, str]:
    """Float32 numbers per decoder row of a CPU search's first step (an ensemble's models summed):
    the row's scores over the target vocabulary, and its self-attention keys and values for the first
    min(capacity, `FIRST_POSITIONS`) positions in every decoder layer (`StepDecoder`'s first buffers; the
    modules' cache holds as many by then), with `source` (the source length of a search that keeps each
    output's cross-attention) also those outputs' attention rows; and what they are."""
    positions = min(capacity, FIRST_POSITIONS)
    floats = source * positions
    for member in getattr(model, "models", [model]):
        cfg = member.config
        floats += cfg.tgt_vocab_size + 2 * cfg.n_decoder_layers * cfg.n_heads * cfg.head_dim * positions
    what = f"the scores over the target vocabulary, and keys and values for {positions} positions"
    return floats, what + (f" and their cross-attention over {source} source positions" if source else "")


def _check_growth(beam: int, step: int, rows: int, row_floats: int, source: int = 0) -> None:
    """`check_beam_memory` for a CPU search's keys and values doubling before `step` (a `memory_check` of
    `StepDecoder` or `ModuleStep`): `rows` decoder rows of `beam` beams each (1: greedy decoding) grow by
    `row_floats`, and with `source` (as `_first_step_floats`) by the attention rows of `step` more outputs."""
    sentences = rows // beam
    what = "keys and values for as many more positions as the search held, in every decoder layer"
    if source:
        row_floats += source * step
        what += f", and their cross-attention over {source} source positions"
    check_beam_memory(
        sentences, beam, row_floats, what, _decode_fix(sentences, beam), f"more at step {step + 1}"
    )


def _decode_fix(sentences: int, beam: int) -> str:
    """The advice of `check_beam_memory`'s error for a search of `beam` beams over `sentences` sentences."""
    fewer = "decode fewer sentences at once (decode.batch_size, decode.max_tokens)"
    if beam == 1:
        shorter = "lower the length limit (decode.max_len_a, decode.max_len_b)"
        return shorter if sentences == 1 else f"{fewer}, or {shorter}"
    more = "" if sentences == 1 else f", or {fewer}"
    return f"lower the beam (decode.beam; decode.val_beam for validation in training){more}"


def _check_beam_args(beam: int, alpha: float, penalty: str, min_len: int, n_best: int) -> None:
    if beam < 1:
        raise ValueError(f"beam={beam} must be >= 1")
    if not 1 <= n_best <= beam:
        raise ValueError(f"n_best={n_best} must be between 1 and beam={beam}: raise beam or lower n_best")
    if min_len < 1:
        raise ValueError(f"min_len={min_len} must be >= 1 (the length counts eos)")
    if not alpha >= 0:
        raise ValueError(f"alpha={alpha} must be >= 0 (0 turns length normalisation off)")
    length_penalty(1, alpha, penalty)  # a known penalty


@torch.inference_mode()
def beam_search(
    model: Transformer,
    src: Tensor,
    *,
    beam: int = 5,
    alpha: float = 0.6,
    penalty: str = "gnmt",
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    min_len: int = 1,
    n_best: int = 1,
    need_attention: bool = False,
    need_token_scores: bool = False,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """Beam search over the incremental K/V cache, B sentences × K beams decoded as one (B·K) batch.

    The source is encoded once; the K beams of a sentence share its memory and cross-attention keys and
    values (they are the sentence's K queries, see `KVCache`); after each step the self-attention cache
    is reordered to follow the surviving beams, and sentences that are done leave the batch. At step 0
    only the first beam of each sentence is live (the others score -inf), so the initial beams are
    distinct; the CPU step (`StepDecoder.narrow_start`) decodes only that row where the vocabulary holds
    the 2K candidates a step keeps, as CTranslate2 does. (W below: decoder rows per sentence, K, or 1 at
    such a first step.)
    Each step scores every extension `score(y_<t) + log p(y_t | y_<t, x)`, keeps the top 2K of
    the W·V candidates per sentence; an eos candidate ranked in the top K becomes a finished hypothesis
    (its length counts the eos), the best K other candidates are the next beams. Pad and the start/bos
    ids are never generated, eos not before `min_len`. A sentence stops at its length limit a·|S| + b
    (`max_output_lengths`; at most the model's `position_limit`), where its live beams are
    finished without eos, or earlier once no live beam can beat its `n_best` best finished hypotheses
    (`_Kept.is_done`): those are then final, so stopping there returns what running on would. With the
    default `n_best=1` a sentence ends as soon as its best finished hypothesis outranks every live beam
    (CTranslate2 stops on a similar rule without a length penalty), not once K hypotheses are finished
    (fairseq, Hugging Face's `generate`): at beam 5 that decoded test2016 1.2× faster with the same
    outputs (docs/benchmarks.md).

    Long because it reads top-down as one loop: encode, then per step score, select, finish, reorder the
    cache and drop done sentences; split into functions, the tensors of one step would travel as a dozen
    arguments.

    Args:
        model: The Transformer (its mode is left unchanged; call `.eval()` first for inference).
        src: Source ids (B, S), padded with the model's pad id; moved to the model's device.
        beam: Beam size K.
        alpha: Length-penalty exponent α (0: rank by raw log-probability).
        penalty: `gnmt`, ((5 + |Y|) / 6)^α, or `fairseq`, |Y|^α (`length_penalty`).
        max_len_a: Output length limit a in a · |S| + b (per sentence, eos included).
        max_len_b: Output length limit b.
        min_len: Shortest output allowed, eos included.
        n_best: Hypotheses returned per sentence (<= beam).
        need_attention: Also return each hypothesis' cross-attention (see `Hypothesis.attention`).
        need_token_scores: Also track each token's log-probability (`Hypothesis.token_scores`; n-best
            lists), an extra gather per step that plain decoding skips.
        use_cache: Decode over the K/V cache (the default); False re-runs the decoder over each beam's
            whole prefix at every step (the same result, slower; for benchmarks and tests).

    Returns:
        Per sentence, its `n_best` best hypotheses sorted by normalized score, best first.

    Raises:
        ValueError: The arguments (`_check_beam_args`).
        ConfigError: On the CPU, its first step or a later growth of its keys and values (and of the
            attention it keeps, with `need_attention`) needs more memory than this process can take
            (`check_beam_memory`), before it allocates.
        NonFiniteScores: Scores that are NaN (no hypothesis found).
    """
    _check_beam_args(beam, alpha, penalty, min_len, n_best)
    cfg = model.config
    device = next(model.parameters()).device
    src = src.to(device)
    batch, k, vocab = src.size(0), beam, cfg.tgt_vocab_size
    limits = max_output_lengths(src, cfg.pad_id, max_len_a, max_len_b, cfg.position_limit)  # (B,)
    limit_list = limits.tolist()
    longest = max(limit_list)
    kept_source = src.size(1) if need_attention else 0  # the attention rows each output keeps
    if device.type == "cpu":
        floats, what = _first_step_floats(model, longest, kept_source)
        check_beam_memory(batch, k, floats, what, _decode_fix(batch, k))
    memory, source_mask = model.encode(src)  # (B, S, D); (B, S) for the attention rows of finished hypotheses
    decoder = decoding_step(model, memory, decoder_mask(source_mask), beams=k, capacity=longest,
                            use_cache=use_cache, need_weights=need_attention,
                            memory_check=functools.partial(_check_growth, k, source=kept_source))  # fmt: skip
    # Step 0 has one live beam per sentence: where the step can (`narrow_start`; CTranslate2 does the same
    # on the CPU), only that row is decoded and the first reorder makes the K beams from it.
    width = 1 if decoder.narrow_start and 2 * k <= vocab else k  # decoder rows per sentence this step
    token = torch.full((batch * width, 1), cfg.start_id, dtype=torch.long, device=device)
    start = token
    history = torch.empty(batch * width, 0, dtype=torch.long, device=device)  # (B·W, T) outputs so far
    history_lp = None  # (B·W, T) their log-probabilities, when asked
    if need_token_scores:
        history_lp = torch.empty(batch * width, 0, device=device)
    attn = None  # (B·W, T, S) cross-attention of the outputs so far, when asked
    if need_attention:
        attn = torch.empty(batch * width, 0, src.size(1), device=device, dtype=memory.dtype)
    scores = torch.zeros(batch, k, device=device)
    scores[:, 1:] = -math.inf  # step 0: one live beam per sentence
    kept = [_Kept(k, alpha, penalty, n_best) for _ in range(batch)]
    done = [False] * batch
    alive = list(range(batch))  # the sentence of each group of K decoder rows; finished ones leave
    never = ungenerable_ids(cfg, device)

    def finish(owners: list[int], tokens: Tensor, ends: Tensor, attn_rows: Tensor | None,
               lp: Tensor | None) -> None:  # fmt: skip
        """Hand candidates `tokens` (n, T) with scores `ends` (n,) and token log-probabilities `lp` (n, T;
        None: not tracked), in order, to the kept lists of their sentences `owners` (n,); candidates
        scored -inf are dropped. Called at most twice a step (eos candidates, then beams at their length
        limit), each time for every sentence at once: the tensors are read back with one `tolist` each,
        not per sentence (a hypothesis' attention rows, when asked, are still cut per hypothesis)."""
        token_scores = [[] for _ in owners] if lp is None else lp.tolist()
        candidates = zip(owners, tokens.tolist(), ends.tolist(), token_scores, strict=True)
        for r, (b, ids, score, row_lp) in enumerate(candidates):
            if score > -math.inf:
                a = None if attn_rows is None else attn_rows[r][:, source_mask[b]]  # (T, S_real)
                kept[b].add(ids, score, a, row_lp)

    for step in range(longest):
        length = step + 1  # output length of this step's candidates, eos included
        live = len(alive)
        fed = token if use_cache else torch.cat([start, history], dim=1)  # (B'·W, 1 | T+1)
        out = decoder(fed)
        logits, weights = out if need_attention else (out, None)
        last = logits[:, -1]  # (B'·W, V)
        # Over the CPU step's own logits, the log-probs and then the candidates' scores are written in
        # place (the same kernels, the same values): two (B'·W, V) allocations fewer a step, 4-8% of beam
        # 5's time at batch 1 and 64 (docs/benchmarks.md). The modules' logits are the model's to keep.
        if decoder.fresh_logits and last.dtype == torch.float32 and last.is_contiguous():
            lprobs = torch.ops.aten._log_softmax.out(last, -1, False, out=last)
        else:
            lprobs = last.float().log_softmax(dim=-1)
        mask_ungenerable(lprobs, never, cfg.eos_id, length, min_len)
        if history_lp is None:  # the token scores, when asked, are read from lprobs below
            cand = lprobs.view(live, width, vocab).add_(scores[:, :width, None])  # (B', W, V)
        else:
            cand = scores[:, :width, None] + lprobs.view(live, width, vocab)
        top_scores, top_idx = top_candidates(cand.view(live, width * vocab), 2 * k)  # (B', 2K)
        top_beam, top_token = top_idx // vocab, top_idx % vocab  # (B', 2K)
        top_lp = None  # (B', 2K) the new tokens' log-probs, when asked
        if history_lp is not None:
            top_lp = lprobs.view(live, width * vocab).gather(1, top_idx)
        parent = torch.arange(live, device=device)[:, None] * width + top_beam  # (B', 2K) rows of B'·W
        width = k
        step_attn = None if weights is None else weights[-1].mean(dim=1)[:, -1:]  # (B'·W, 1, S)

        is_eos = top_token == cfg.eos_id  # (B', 2K)
        eos_at = is_eos[:, :k].nonzero()  # (E, 2): live row (of B') and rank of each eos in the top K
        if eos_at.size(0):  # only eos ranked in the top K finishes
            at, rank = eos_at.unbind(1)
            rows = parent[at, rank]  # (E,)
            tokens = torch.cat([history.index_select(0, rows), top_token[at, rank, None]], dim=1)  # (E, T+1)
            a = None if attn is None else torch.cat([attn[rows], step_attn[rows]], dim=1)
            lp = None if top_lp is None else torch.cat([history_lp[rows], top_lp[at, rank, None]], dim=1)
            finish([alive[i] for i in at.tolist()], tokens, top_scores[at, rank], a, lp)
        # The K best non-eos candidates (at most K of the 2K are eos, one per beam) become the beams.
        order = is_eos.long() * (2 * k) + torch.arange(2 * k, device=device)  # (B', 2K)
        pick = order.topk(k, dim=1, largest=False).values  # (B', K) candidate ranks, best first
        scores = top_scores.gather(1, pick)  # (B', K)
        flat = parent.gather(1, pick).view(-1)  # (B'·K,)
        token = top_token.gather(1, pick).view(-1, 1)  # (B'·K, 1)
        history = torch.cat([history.index_select(0, flat), token], dim=1)  # (B'·K, T+1)
        if history_lp is not None:
            history_lp = torch.cat([history_lp.index_select(0, flat), top_lp.gather(1, pick).view(-1, 1)], 1)
        if attn is not None:
            attn = torch.cat([attn.index_select(0, flat), step_attn.index_select(0, flat)], dim=1)
        best_live = scores.max(dim=1).values.tolist()  # one host transfer for every sentence
        ended = [i for i, b in enumerate(alive) if length >= limit_list[b]]
        if ended:  # force-finish the live beams of sentences at their length limit, without eos
            at = torch.tensor(ended, device=device)
            rows = (at[:, None] * k + torch.arange(k, device=device)).view(-1)  # (E·K,)
            lp = None if history_lp is None else history_lp[rows]
            owners = [alive[i] for i in ended for _ in range(k)]
            finish(owners, history[rows], scores[at].view(-1), None if attn is None else attn[rows], lp)
        for i, b in enumerate(alive):
            done[b] = length >= limit_list[b] or kept[b].is_done(best_live[i], limit_list[b])
        keep = [i for i, b in enumerate(alive) if not done[b]]
        if not keep:
            break
        if len(keep) < live:  # finished sentences leave the batch
            alive = [alive[i] for i in keep]
            sentences = torch.tensor(keep, device=device)
            rows = (sentences[:, None] * k + torch.arange(k, device=device)).view(-1)  # (B''·K,)
            scores, flat, token, history = scores[sentences], flat[rows], token[rows], history[rows]
            history_lp = None if history_lp is None else history_lp[rows]
            attn = None if attn is None else attn[rows]
            if not use_cache:
                start = start[rows]
            decoder.reorder(flat, sentences)
        else:
            decoder.reorder(flat)
    lost = [b for b, sentence in enumerate(kept) if not sentence.hyps]
    if lost:  # no score was ever finite: every candidate compared false
        raise non_finite_scores("beam search", len(lost), batch, lost[0])
    return [sentence.hyps[:n_best] for sentence in kept]


def translate(
    model: Transformer,
    src: Tensor,
    config: DecodeConfig,
    beam: int | None = None,
    *,
    use_cache: bool = True,
    unfinished: list[int] | None = None,
) -> list[list[int]]:
    """The best output ids of each sentence under the decoding settings `config`, eos and padding
    removed: `greedy_decode` when the beam is 1 (drawing tokens with `config.sampling`, `Sampling`), else
    `beam_search` with `config.alpha` and `config.length_penalty`; both honour
    `config.min_len`, `config.max_len_a` and `config.max_len_b`. Given a list `unfinished`, the indices of
    the sentences whose output ran to its length limit without eos are appended to it.

    Args:
        model: The Transformer (call `.eval()` first).
        src: Source ids (B, S), padded with the model's pad id.
        config: Decoding settings.
        beam: Beam size; `config.beam` when omitted (validation decodes pass `config.val_beam`).
        use_cache: Decode over the K/V cache (see `greedy_decode`).
    """
    cfg, beam = model.config, config.beam if beam is None else beam
    limits = {"max_len_a": config.max_len_a, "max_len_b": config.max_len_b, "min_len": config.min_len}
    if config.sampling and beam != 1:
        raise ValueError(f"beam={beam} but decode.sampling=true draws one output per sentence: decode with "
                         "beam 1 (sampling does not combine with beam search)")  # fmt: skip
    if beam == 1:
        sample = Sampling.of(config) if config.sampling else None
        rows = greedy_decode(model, src, **limits, use_cache=use_cache, sample=sample).tolist()
    else:
        best = beam_search(model, src, beam=beam, alpha=config.alpha, penalty=config.length_penalty,
                           **limits, use_cache=use_cache)  # fmt: skip
        rows = [hyps[0].tokens for hyps in best]
    ended = [cfg.eos_id in row for row in rows]
    if unfinished is not None:
        unfinished.extend(i for i, done in enumerate(ended) if not done)
    return [row[: row.index(cfg.eos_id)] if done else [t for t in row if t != cfg.pad_id]
            for row, done in zip(rows, ended, strict=True)]  # fmt: skip


def nbest_decode(
    model: Transformer,
    src: Tensor,
    config: DecodeConfig,
    *,
    n_best: int = 1,
    need_attention: bool = False,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """The `n_best` best hypotheses of each sentence under `config`, best first, with their scores (and
    cross-attention with `need_attention`): `beam_search` with `config.beam` beams, `config.alpha` and
    `config.length_penalty`. With one beam it is `beam_search(beam=1, alpha=0)`, which gives
    `greedy_decode`'s outputs, so the first hypothesis is always the output `translate` gives (eos and
    padding removed); its `normalized` score is then `score` (greedy decoding ranks nothing).

    Raises:
        ValueError: `n_best` is not between 1 and `config.beam`.
    """
    alpha = 0.0 if config.beam == 1 else config.alpha
    return beam_search(
        model, src, beam=config.beam, alpha=alpha, penalty=config.length_penalty, max_len_a=config.max_len_a,
        max_len_b=config.max_len_b, min_len=config.min_len, n_best=n_best, need_attention=need_attention,
        need_token_scores=True, use_cache=use_cache,
    )  # fmt: skip
