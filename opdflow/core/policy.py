"""Which staleness policy a run uses: the one place a config or a sweep's k becomes a policy.

A run's StalenessConfig names its policy ("fixed" at k, or "adaptive" from k up to k_max);
a sweep, a bench or the simulator names one by a token, an integer k or "adaptive", and
runs the adaptive policy from k = 0 up to the largest fixed k it was given. `make_policy`
turns the first into the policy object (which then answers k, k_max and the live-version
bound), `settings_for` turns a token into the first, `parse_ks` reads a list of tokens.
The driver, the simulator, `opdflow sweep`, `opdflow simulate` and the benches all go
through here.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, TypeVar

from opdflow.core.adaptive import AdaptiveStaleness
from opdflow.core.staleness import FixedStaleness, StalenessPolicy
from opdflow.errors import ConfigError

ADAPTIVE = "adaptive"
"""The token (and StalenessConfig.policy) of the adaptive policy."""

KToken = int | str
"""A staleness bound k >= 0, or ADAPTIVE."""


class StalenessSettings(Protocol):
    """The fields of opdflow.config.StalenessConfig a policy is made from."""

    policy: str
    k: int
    k_max: int
    target_wait_share: float
    budget_nats: float


S = TypeVar("S", bound=StalenessSettings)


def make_policy(cfg: StalenessSettings) -> StalenessPolicy:
    """The policy a StalenessConfig names: FixedStaleness(k), or AdaptiveStaleness from k."""
    if cfg.policy == ADAPTIVE:
        return AdaptiveStaleness.from_config(cfg)
    return FixedStaleness(cfg.k)


def settings_for(token: KToken, base: S, k_max: int) -> S:
    """`base` (a StalenessConfig) set to run one sweep token: fixed at k, or adaptive from
    k = 0 up to `k_max` (a sweep's largest fixed k, `sweep_k_max`)."""
    if token == ADAPTIVE:
        return dataclasses.replace(base, policy=ADAPTIVE, k=0, k_max=k_max)
    return dataclasses.replace(base, policy="fixed", k=int(token))


def sweep_k_max(tokens: list[KToken], default: int) -> int:
    """k_max of a sweep's adaptive run: its largest fixed k (`default` when it has none)."""
    return max((int(k) for k in tokens if k != ADAPTIVE), default=default)


def token_of(policy: str, k: int) -> KToken:
    """The token a run's staleness settings (policy, k) stand for in a sweep."""
    return ADAPTIVE if policy == ADAPTIVE else int(k)


def k_label(token: KToken) -> str:
    """'k=2' or 'adaptive': how tables and directory names show a token."""
    return ADAPTIVE if token == ADAPTIVE else f"k={token}"


def parse_ks(text: str, option: str = "--k") -> list[KToken]:
    """'0,1,2,adaptive' -> [0, 1, 2, 'adaptive'] with errors naming the option and bad item."""
    out: list[KToken] = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        if item in (ADAPTIVE, "a"):
            out.append(ADAPTIVE)
        elif item.isdigit():
            out.append(int(item))
        else:
            raise ConfigError(
                f"{option} item {item!r} is not allowed: expected integers >= 0 or 'adaptive', "
                f"e.g. {option} 0,1,2,4,8,adaptive"
            )
    if not out:
        raise ConfigError(f"{option} is empty: give staleness bounds, e.g. {option} 0,1,2,4,8")
    return out
