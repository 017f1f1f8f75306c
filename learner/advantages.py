"""Group advantages for outcome rewards (docs/ALGORITHMS.md §1.2, §4.3).

Every estimator here maps the rewards of one prompt's group to one advantage per response; the
learner broadcasts it to all tokens of that response. The estimators are pure functions of a
1-D reward vector (a list of floats/bools or a tensor) and return float32 tensors of shape (n,).

Why float64: in float32 an all-equal group of non-representable rewards (0.1, 2.2) leaves
advantages as large as 0.19 after dividing by std + 1e-6 (§1.2 "Precision"). We compute in
float64 *and* special-case all-equal groups, so such groups give exactly 0 whatever the value.

Run the tests with: .venv/bin/python -m pytest tests/test_advantages.py
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Rewards = Sequence[float] | Sequence[bool] | torch.Tensor


def _as_f64(rewards: Rewards) -> torch.Tensor:
    """Rewards as a detached float64 CPU-or-same-device vector, shape (n,)."""
    if isinstance(rewards, torch.Tensor):
        r = rewards.detach().to(torch.float64)
    else:
        r = torch.tensor([float(x) for x in rewards], dtype=torch.float64)
    if r.dim() != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(r.shape)}")
    return r


def _has_no_signal(r: torch.Tensor) -> bool:
    """True for a singleton group or one whose rewards are all bitwise equal (§1.2)."""
    return r.numel() <= 1 or bool((r == r[0]).all())


def grpo_advantages(rewards: Rewards, std_mode: str = "unbiased", eps: float = 1e-6) -> torch.Tensor:
    """GRPO: A_i = (r_i - mean(r)) / (std(r) + eps)   [R:S4 §3.1], [R:VERL].

    std_mode "unbiased" (Bessel, verl's torch.std, the default) or "population" (AERO, whose
    derivation uses sigma^2 = mu(1 - mu), §4.1). All-equal rewards give exactly 0. A singleton
    group gives 0 (a lone sample has no baseline; verl would return r, §1.2 [I]); the caller
    counts such groups as `singleton_groups`.
    """
    r = _as_f64(rewards)  # (n,)
    match std_mode:
        case "unbiased":
            correction = 1
        case "population":
            correction = 0
        case _:
            raise ValueError(f"std_mode must be 'unbiased' or 'population', got {std_mode!r}")
    if _has_no_signal(r):
        return torch.zeros_like(r, dtype=torch.float32)
    std = torch.std(r, correction=correction)
    return ((r - r.mean()) / (std + eps)).to(torch.float32)


def drgrpo_advantages(rewards: Rewards) -> torch.Tensor:
    """Dr. GRPO: A_i = r_i - mean(r), no std division (it biases length, §2) [R:DRG]."""
    r = _as_f64(rewards)  # (n,)
    if _has_no_signal(r):
        return torch.zeros_like(r, dtype=torch.float32)
    return (r - r.mean()).to(torch.float32)


def rloo_advantages(rewards: Rewards) -> torch.Tensor:
    """RLOO: A_i = r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean(r))  [K:Ahmadian et al. 2024].

    A singleton group has no leave-one-out baseline and gives 0 (same rule as GRPO, §1.2).
    """
    r = _as_f64(rewards)  # (n,)
    if _has_no_signal(r):
        return torch.zeros_like(r, dtype=torch.float32)
    n = r.numel()
    return (n / (n - 1) * (r - r.mean())).to(torch.float32)


def bayesian_degenerate_advantages(
    acc: Rewards,
    c_obs: int,
    n_obs: int,
    alpha0: float = 1.0,
    beta0: float = 1.0,
    form: str = "std",
) -> torch.Tensor:
    """AERO Bayesian smoothing for an all-fail or all-correct retained group (§4.3 [I]).

    u = (c_obs + alpha0) / (n_obs + alpha0 + beta0) is the Beta posterior mean over *all*
    rollouts generated for the prompt this step (c_obs correct of n_obs), not only the retained
    ones in `acc`, so more evidence shrinks the push.
      form "std":       A_i = (acc_i - u) / sqrt(u (1 - u)); the std of a binary group with
                        mean u, the scale AERO's proof uses [R:S4 A.2]. With Beta(1,1) this is
                        -1/sqrt(n_obs + 1) for all-fail and +1/sqrt(n_obs + 1) for all-correct.
      form "mean_only": A_i = acc_i - u (the Dr. GRPO-style alternative, magnitude 1/(n_obs+2)).
    Mixed groups are rejected: they carry their own signal and belong to grpo_advantages.
    """
    a = _as_f64(acc)  # (n,)
    if not _has_no_signal(a):
        raise ValueError("bayesian_degenerate_advantages needs an all-fail or all-correct group")
    if not 0 <= c_obs <= n_obs:
        raise ValueError(f"need 0 <= c_obs <= n_obs, got c_obs={c_obs}, n_obs={n_obs}")
    if alpha0 <= 0 or beta0 <= 0:
        raise ValueError(f"alpha0 and beta0 must be > 0, got {alpha0}, {beta0}")
    u = (c_obs + alpha0) / (n_obs + alpha0 + beta0)
    match form:
        case "std":
            adv = (a - u) / (u * (1.0 - u)) ** 0.5
        case "mean_only":
            adv = a - u
        case _:
            raise ValueError(f"form must be 'std' or 'mean_only', got {form!r}")
    return adv.to(torch.float32)
