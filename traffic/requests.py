"""A seeded stream of P/D inference requests: Poisson arrivals, multi-turn sessions.

The 002 text sizes the P:D ratio from *mean* prompt and output lengths
and a cache-hit ratio H (section 4's profiles); its scheduling section 7
adds that coding agents are "multi-turn long-context, not one-shot
prompts": a session stays on its D (D-sticky) and a warm turn sends only
the delta KV.  This module draws such a stream:

* **Sessions** start as a Poisson process of rate ``rate_per_s /
  turns_mean``; a session has a geometric number of turns with mean
  ``turns_mean``, its turns ``think_s`` apart on average (exponential;
  this gap covers the previous turn's decode and the user or the agent
  thinking).  With ``turns_mean = 1`` the request arrivals are exactly
  Poisson with rate ``rate_per_s``; otherwise session starts are, and the
  long-run request rate is still ``rate_per_s`` (the stream starts with
  no session open, so warm turns ramp up over the first few
  ``turns_mean x think_s`` seconds).
* **Lengths** are drawn per request from a lognormal with the profile's
  mean and coefficient of variation, clipped to the model's limits
  (200K context, 128K output for GLM-5.1, section 3).
* **Cache hits**: the first turn of a session is cold.  A warm turn finds
  the fraction ``hit_ratio / (1 - 1/turns_mean)`` of its prompt already
  on D_home, so that over the stream the share of prompt tokens that hit
  is H, the H of section 4's formula.  Context growth from turn to turn
  is not modelled: prompt lengths keep the profile's distribution.

Deterministic: the same workload, rate and seed give the same stream, and
a shorter stream (smaller ``count``) is a prefix of a longer one.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from traffic import kvcache

#: GLM-5.1's context window (202,752 = 198 x 1024 tokens) and maximum output.
MAX_CONTEXT_TOKENS = 202_752
MAX_OUTPUT_TOKENS = 131_072


class StreamError(ValueError):
    """A workload or stream parameter is out of range."""


@dataclass(frozen=True)
class LengthDist:
    """Token counts: lognormal with this mean and coefficient of variation, clipped."""

    mean: float
    cv: float = 0.5
    minimum: int = 1
    maximum: Optional[int] = None

    def __post_init__(self):
        if self.mean < 1 or self.cv < 0 or self.minimum < 1:
            raise StreamError(f"length distribution needs mean >= 1, cv >= 0, minimum >= 1; "
                              f"got {self.mean}, {self.cv}, {self.minimum}")
        if self.maximum is not None and self.maximum < self.minimum:
            raise StreamError(f"length distribution maximum {self.maximum} < minimum "
                              f"{self.minimum}")

    def sample(self, rng: random.Random) -> int:
        if self.cv == 0:
            value = self.mean
        else:
            sigma2 = math.log(1 + self.cv ** 2)
            value = rng.lognormvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
        value = max(self.minimum, int(round(value)))
        return value if self.maximum is None else min(self.maximum, value)


@dataclass(frozen=True)
class Workload:
    """What a request stream looks like: lengths, cache hits and sessions."""

    name: str
    prompt: LengthDist
    output: LengthDist
    hit_ratio: float = 0.0
    turns_mean: float = 1.0
    think_s: float = 30.0

    def __post_init__(self):
        if not 0 <= self.hit_ratio < 1:
            raise StreamError(f"workload {self.name}: hit_ratio must be within [0, 1), "
                              f"got {self.hit_ratio}")
        if self.turns_mean < 1 or self.think_s <= 0:
            raise StreamError(f"workload {self.name}: turns_mean must be >= 1 and think_s > 0")
        if self.warm_hit_ratio > 1:
            raise StreamError(
                f"workload {self.name}: hit_ratio {self.hit_ratio} needs warm turns to hit "
                f"{self.warm_hit_ratio:.2f} of their prompt; raise turns_mean (warm share of "
                f"requests is 1 - 1/turns_mean = {1 - 1 / self.turns_mean:.2f})")

    @property
    def warm_share(self) -> float:
        """Long-run share of requests that are warm (not a session's first turn)."""
        return 1 - 1 / self.turns_mean

    @property
    def warm_hit_ratio(self) -> float:
        """Share of a warm turn's prompt already on D_home."""
        if self.hit_ratio == 0:
            return 0.0
        if self.warm_share == 0:
            return math.inf
        return self.hit_ratio / self.warm_share


@dataclass(frozen=True)
class Request:
    """One turn of one session.  Tokens: the full prompt, the part cached on
    the session's D (D_home), and the output to generate."""

    id: str
    session: str
    turn: int
    arrival_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int

    @property
    def warm(self) -> bool:
        return self.cached_tokens > 0

    @property
    def new_tokens(self) -> int:
        """Tokens to prefill, and whose KV travels when D already holds the rest."""
        return self.prompt_tokens - self.cached_tokens

    def kv_bytes(self, config: kvcache.ModelConfig) -> int:
        """KV of the whole prompt: what a cold turn, or a move to another D, sends."""
        return kvcache.kv_bytes_per_request(config, self.prompt_tokens)

    def transfer_bytes(self, config: kvcache.ModelConfig, on_home: bool = True) -> int:
        """P -> D KV bytes: the delta on the session's own D, else the whole prompt."""
        tokens = self.new_tokens if on_home else self.prompt_tokens
        return kvcache.kv_bytes_per_request(config, tokens)


def workload_from_profile(item: kvcache.Profile, cv: float = 0.5, turns_mean: float = 0.0,
                          think_s: float = 30.0) -> Workload:
    """A stream for one of section 4's profiles: its mean lengths and hit ratio.

    ``turns_mean`` 0 means one turn for a profile without cache hits and
    4 turns (75% warm requests) for one with.
    """
    turns = turns_mean or (4.0 if item.hit_ratio else 1.0)
    return Workload(
        name=item.name,
        prompt=LengthDist(item.input_tokens, cv, minimum=16, maximum=MAX_CONTEXT_TOKENS),
        output=LengthDist(item.output_tokens, cv, minimum=1, maximum=MAX_OUTPUT_TOKENS),
        hit_ratio=item.hit_ratio, turns_mean=turns, think_s=think_s)


#: Section 4's four profiles as streams.
WORKLOADS: Dict[str, Workload] = {p.name: workload_from_profile(p)
                                  for p in kvcache.TEXT_PROFILES}


def workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise StreamError(f"unknown workload {name!r}; known: "
                          f"{', '.join(sorted(WORKLOADS))}") from None


def _turns(rng: random.Random, mean: float) -> int:
    """Geometric number of turns >= 1 with the given mean."""
    stop, turns = 1 / mean, 1
    while rng.random() >= stop:
        turns += 1
    return turns


def generate(load: Workload, rate_per_s: float, seed: int, count: Optional[int] = None,
             duration_s: Optional[float] = None) -> List[Request]:
    """The first ``count`` requests, or those arriving before ``duration_s``."""
    if (count is None) == (duration_s is None):
        raise StreamError("give exactly one of count or duration_s")
    if rate_per_s <= 0:
        raise StreamError(f"rate_per_s must be > 0, got {rate_per_s}")
    if (count is not None and count < 0) or (duration_s is not None and duration_s < 0):
        raise StreamError("count and duration_s must be >= 0")
    rng = random.Random(seed)
    session_rate = rate_per_s / load.turns_mean
    warm_hit = load.warm_hit_ratio
    pending: list = []      # heap of (arrival_s, session, turn, prompt, cached, output)
    ready: list = []        # arrivals final: no later session can arrive before them
    start, session = 0.0, 0
    while True:
        start += rng.expovariate(session_rate)
        while pending and pending[0][0] <= start:
            ready.append(heapq.heappop(pending))
        if duration_s is not None and start >= duration_s:
            break
        if count is not None and len(ready) >= count:
            break
        at = start
        for turn in range(_turns(rng, load.turns_mean)):
            if turn:
                at += rng.expovariate(1 / load.think_s)
            prompt, output = load.prompt.sample(rng), load.output.sample(rng)
            cached = min(prompt - 1, int(round(warm_hit * prompt))) if turn else 0
            heapq.heappush(pending, (at, session, turn, prompt, cached, output))
        session += 1
    if duration_s is not None:
        ready += [heapq.heappop(pending) for _ in range(len(pending))]
        ready = [item for item in ready if item[0] < duration_s]
    else:
        ready = ready[:count]
    width = max(6, len(str(len(ready))))
    return [Request(id=f"r{index:0{width}d}", session=f"s{item[1]:0{width}d}", turn=item[2],
                    arrival_s=item[0], prompt_tokens=item[3], cached_tokens=item[4],
                    output_tokens=item[5])
            for index, item in enumerate(ready)]


def token_hit_ratio(requests: Sequence[Request]) -> float:
    """Share of prompt tokens already cached on D: the H of the P:D formula."""
    total = sum(r.prompt_tokens for r in requests)
    return sum(r.cached_tokens for r in requests) / total if total else 0.0


def summary(requests: Sequence[Request]) -> Dict[str, float]:
    """Measured stream figures, to set against the workload's parameters."""
    if not requests:
        return {"requests_count": 0}
    span = requests[-1].arrival_s - requests[0].arrival_s
    return {
        "requests_count": len(requests),
        "sessions_count": len({r.session for r in requests}),
        "rate_per_s": (len(requests) - 1) / span if span > 0 else 0.0,
        "mean_prompt_tokens": sum(r.prompt_tokens for r in requests) / len(requests),
        "mean_output_tokens": sum(r.output_tokens for r in requests) / len(requests),
        "warm_ratio": sum(r.warm for r in requests) / len(requests),
        "hit_ratio": token_hit_ratio(requests),
    }
