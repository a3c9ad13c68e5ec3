"""Synthetic workloads for the simulator: seeded, reproducible, no I/O.

A workload is a list of ``SimJob`` sorted by arrival. Tenants have Zipf-ish sizes (the
tenant of rank r sends a share proportional to ``1 / (r + 1) ** zipf_s``), a weight and
a priority tier; each request has a Poisson arrival time, a prompt and an output
length (log-normal, clipped), a speculative flag and its own acceptance rate drawn
from a Beta distribution. The same ``WorkloadSpec`` and seed always give the same jobs.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import statistics
from dataclasses import dataclass, field

from speclane.sim.cost import CostModel


@dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int = 10_000
    num_tenants: int = 1_000
    zipf_s: float = 1.0  # tenant sizes: share of rank r is proportional to 1 / (r + 1) ** zipf_s
    # Arrival rate in requests/s; 0 = derive it from ``load`` and the cost model (see simulator).
    rate_per_s: float = 0.0
    load: float = 0.85  # offered load relative to the estimated capacity, when rate_per_s is 0
    prompt_median: int = 160
    prompt_sigma: float = 0.8
    prompt_range: tuple[int, int] = (8, 1024)
    output_median: int = 96
    output_sigma: float = 0.7
    output_range: tuple[int, int] = (8, 768)
    speculative_fraction: float = 0.85  # requests that ask for the lane (speculative=true)
    # Tenant tiers: (priority, probability). The heaviest tenant is always priority 0 so
    # the tenant-fairness story (one big tenant against many small ones) is always there.
    priority_tiers: tuple[tuple[int, float], ...] = ((0, 0.85), (-1, 0.05), (1, 0.10))
    heavy_weight_fraction: float = 0.1  # tenants with weight 2 (the rest have 1)
    acceptance_beta: tuple[float, float] = (3.0, 2.0)  # per-request draft acceptance ~ Beta(a, b)

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"the number of requests must be >= 1; got {self.num_requests}")
        if self.num_tenants < 1:
            raise ValueError(f"the number of tenants must be >= 1; got {self.num_tenants}")
        if self.rate_per_s < 0 or not self.load > 0:
            raise ValueError("rate_per_s must be >= 0 and load > 0")
        if min(self.acceptance_beta) <= 0:
            raise ValueError(f"acceptance_beta parameters must be > 0; got {self.acceptance_beta}")

    @property
    def mean_prompt_tokens(self) -> float:
        return _clipped_lognormal_mean(self.prompt_median, self.prompt_sigma, self.prompt_range)

    @property
    def mean_output_tokens(self) -> float:
        return _clipped_lognormal_mean(self.output_median, self.output_sigma, self.output_range)


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: float
    priority: int


@dataclass(frozen=True)
class SimJob:
    request_id: str
    arrival_s: float
    tenant: Tenant
    num_prompt_tokens: int
    max_tokens: int
    speculative: bool
    acceptance_rate: float  # each draft position is accepted with this probability
    priority: int = field(default=0)


def arrival_rate(spec: WorkloadSpec, cost: CostModel, max_num_seqs: int) -> float:
    """Requests/s for ``spec.load`` of the estimated capacity (``spec.rate_per_s`` if set).

    Capacity: a full batch of ``max_num_seqs`` decode rows per tick, each request needing
    its mean output in such rows plus its mean prompt in prefill tokens. Speculation's
    extra tokens are left out, so the real load is a little lower than ``load``."""
    if spec.rate_per_s > 0:
        return spec.rate_per_s
    tick_ms = cost.step_ms(decode_tokens=max_num_seqs)
    per_request_ms = spec.mean_output_tokens * tick_ms / max_num_seqs + spec.mean_prompt_tokens * cost.prefill_token_ms
    return spec.load * 1000.0 / per_request_ms


def make_tenants(spec: WorkloadSpec, rng: random.Random) -> list[Tenant]:
    tiers, probs = zip(*spec.priority_tiers, strict=True)
    tenants = []
    for rank in range(spec.num_tenants):
        priority = 0 if rank == 0 else rng.choices(tiers, weights=probs)[0]
        weight = 2.0 if rng.random() < spec.heavy_weight_fraction else 1.0
        tenants.append(Tenant(f"t{rank:04d}", weight, priority))
    return tenants


def make_workload(spec: WorkloadSpec, seed: int, rate_per_s: float | None = None) -> list[SimJob]:
    """The jobs of ``spec`` under ``seed``; ``rate_per_s`` overrides the spec's rate."""
    rate = rate_per_s if rate_per_s is not None else spec.rate_per_s
    if not rate > 0:
        raise ValueError(f"the arrival rate must be > 0 requests/s; got {rate}")
    rng = random.Random(seed)
    tenants = make_tenants(spec, rng)
    cumulative = list(itertools.accumulate(1.0 / (r + 1) ** spec.zipf_s for r in range(spec.num_tenants)))
    a, b = spec.acceptance_beta
    jobs = []
    now = 0.0
    for i in range(spec.num_requests):
        now += rng.expovariate(rate)
        tenant = tenants[min(bisect.bisect_left(cumulative, rng.random() * cumulative[-1]), len(tenants) - 1)]
        jobs.append(SimJob(
            request_id=f"r{i:05d}",
            arrival_s=now,
            tenant=tenant,
            num_prompt_tokens=_lognormal_int(rng, spec.prompt_median, spec.prompt_sigma, spec.prompt_range),
            max_tokens=_lognormal_int(rng, spec.output_median, spec.output_sigma, spec.output_range),
            speculative=rng.random() < spec.speculative_fraction,
            acceptance_rate=rng.betavariate(a, b),
            priority=tenant.priority,
        ))
    return jobs


def _lognormal_int(rng: random.Random, median: int, sigma: float, bounds: tuple[int, int]) -> int:
    value = int(round(median * math.exp(rng.gauss(0.0, sigma))))
    return max(bounds[0], min(bounds[1], value))


def _clipped_lognormal_mean(median: int, sigma: float, bounds: tuple[int, int], n: int = 2000) -> float:
    """Mean of the clipped log-normal, by a fixed midpoint quadrature (deterministic)."""
    quantile = statistics.NormalDist().inv_cdf
    total = sum(max(bounds[0], min(bounds[1], median * math.exp(sigma * quantile((i + 0.5) / n)))) for i in range(n))
    return total / n
