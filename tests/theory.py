"""Queueing formulas the theory tests compare the simulator against.

Pure functions of the model's parameters (rates in 1/s, times in s); nothing here imports
the simulator. Notation: arrival rate ``lam``, service rate ``mu`` (1 / mean service time),
``c`` servers, ``b`` batch size. Every ``*_sojourn`` returns the mean time from arrival to
departure (waiting plus service) of one customer (prompt).
"""

from __future__ import annotations

import math

import numpy as np


def _check_stable(rho: float) -> None:
    if not 0 < rho < 1:
        raise ValueError(f"utilisation must be in (0, 1), got {rho}")


def bisect_root(f, lo: float, hi: float, tol: float = 1e-15, iters: int = 200) -> float:
    """A root of ``f`` in ``[lo, hi]`` where ``f(lo)`` and ``f(hi)`` differ in sign."""
    flo, fhi = f(lo), f(hi)
    if flo == 0:
        return lo
    if fhi == 0:
        return hi
    if (flo > 0) == (fhi > 0):
        raise ValueError(f"no sign change on [{lo}, {hi}]: f={flo}, {fhi}")
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        fm = f(mid)
        if fm == 0 or hi - lo < tol:
            return mid
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
    return 0.5 * (lo + hi)


# -- single server ------------------------------------------------------------------------
def mm1_sojourn(lam: float, mu: float) -> float:
    """M/M/1 FIFO (and M/M/1-PS): W = 1 / (mu - lam)."""
    _check_stable(lam / mu)
    return 1.0 / (mu - lam)


def mg1_sojourn(lam: float, mean: float, second_moment: float) -> float:
    """M/G/1 FIFO, Pollaczek-Khinchine: W = E[S] + lam E[S^2] / (2 (1 - rho))."""
    rho = lam * mean
    _check_stable(rho)
    return mean + lam * second_moment / (2.0 * (1.0 - rho))


def md1_sojourn(lam: float, mu: float) -> float:
    """M/D/1: W = 1/mu + rho / (2 mu (1 - rho))."""
    rho = lam / mu
    _check_stable(rho)
    return 1.0 / mu + rho / (2.0 * mu * (1.0 - rho))


def mg1_ps_conditional_sojourn(lam: float, mean: float, size: float) -> float:
    """M/G/1 processor sharing: E[T | S = s] = s / (1 - rho), whatever the size distribution."""
    rho = lam * mean
    _check_stable(rho)
    return size / (1.0 - rho)


# -- several servers ----------------------------------------------------------------------
def erlang_c(c: int, a: float) -> float:
    """Probability of waiting in M/M/c with offered load ``a = lam / mu`` (< c).

    Computed through the Erlang B recursion (stable for any c)."""
    if not 0 < a < c:
        raise ValueError(f"offered load must be in (0, c={c}), got {a}")
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1.0 - rho + rho * b)


def mmc_sojourn(lam: float, mu: float, c: int) -> float:
    """M/M/c FIFO: W = 1/mu + C(c, a) / (c mu - lam)."""
    return 1.0 / mu + erlang_c(c, lam / mu) / (c * mu - lam)


def mmc_wait(lam: float, mu: float, c: int) -> float:
    """M/M/c mean wait in queue: Wq = C(c, a) / (c mu - lam)."""
    return mmc_sojourn(lam, mu, c) - 1.0 / mu


def erlang_c_direct(c: int, a: float) -> float:
    """Erlang C by its textbook sum (a cross-check of :func:`erlang_c` for small c)."""
    rho = a / c
    top = a**c / math.factorial(c) / (1.0 - rho)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


def gim1_sigma_erlang(lam: float, mu: float, c: int) -> float:
    """GI/M/1 with Erlang-c inter-arrival times (c phases of rate ``lam`` each, mean c/lam):
    the root sigma in (0, 1) of sigma = (lam / (lam + mu (1 - sigma)))^c."""
    _check_stable(lam / (c * mu))
    f = lambda s: (lam / (lam + mu * (1.0 - s))) ** c - s  # noqa: E731
    # f(0) > 0; f < 0 just below the trivial root 1 when the queue is stable.
    return bisect_root(f, 0.0, 1.0 - 1e-12)


def gim1_sojourn_erlang(lam: float, mu: float, c: int) -> float:
    """GI/M/1 (Erlang-c arrivals): W = 1 / (mu (1 - sigma))."""
    return 1.0 / (mu * (1.0 - gim1_sigma_erlang(lam, mu, c)))


# -- bulk service -------------------------------------------------------------------------
def bulk_root(lam: float, mu: float, b: int) -> float:
    """The root r in (0, 1) of mu r^(b+1) - (lam + mu) r + lam = 0 (Bailey's bulk queue)."""
    _check_stable(lam / (b * mu))
    f = lambda r: mu * r ** (b + 1) - (lam + mu) * r + lam  # noqa: E731
    return bisect_root(f, 0.0, 1.0 - 1e-12)


def bulk_partial_sojourn_closed(lam: float, mu: float, b: int) -> float:
    """M/M^[1,b]/1 (a free server takes min(waiting, b) at once; batch time ~ Exp(mu) for
    any size), closed form.

    While the server is busy, the number waiting is geometric: P(busy, n) = C r^n (n >= 0);
    P(idle) = (mu / lam) C (an idle server has nobody waiting). Normalising,
    C (1/(1-r) + mu/lam) = 1. A prompt's wait in the queue is E[N_q] / lam (Little) with
    E[N_q] = C r / (1-r)^2, then its batch takes 1/mu.
    """
    r = bulk_root(lam, mu, b)
    c = 1.0 / (1.0 / (1.0 - r) + mu / lam)
    return c * r / (1.0 - r) ** 2 / lam + 1.0 / mu


def _solve_ctmc(q: np.ndarray) -> np.ndarray:
    """Stationary distribution of a generator ``q`` (rows sum to 0)."""
    n = q.shape[0]
    a = q.T.copy()
    a[-1, :] = 1.0  # replace one balance equation by the normalisation
    rhs = np.zeros(n)
    rhs[-1] = 1.0
    return np.linalg.solve(a, rhs)


def bulk_ctmc_sojourn(lam: float, mu: float, b: int, min_batch: int = 1, n_max: int | None = None) -> float:
    """Bulk service M/M^[a,b]/1 (``a = min_batch``) by a truncated CTMC of (waiting, busy).

    A free server starts a batch of min(waiting, b) prompts as soon as at least ``a`` wait;
    the batch takes Exp(mu) whatever its size. States: (n, idle) for n < a, (n, busy) for
    n >= 0, with n the number waiting (truncated at ``n_max``; arrivals beyond are
    dropped, which is negligible when the tail mass is tiny, as checked). Mean sojourn is
    E[N_q] / lam + 1/mu.
    """
    _check_stable(lam / (b * mu))
    if not 1 <= min_batch <= b:
        raise ValueError(f"need 1 <= min_batch <= b, got {min_batch}, {b}")
    if n_max is None:
        n_max = 64
        while bulk_root(lam, mu, b) ** n_max > 1e-14 and n_max < 20000:
            n_max *= 2
    idle = {n: n for n in range(min_batch)}
    busy = {n: min_batch + n for n in range(n_max + 1)}
    size = min_batch + n_max + 1
    q = np.zeros((size, size))

    def rate(i: int, j: int, r: float) -> None:
        q[i, j] += r
        q[i, i] -= r

    for n, i in idle.items():
        # An arrival joins the waiting prompts; with min_batch waiting the server starts
        # (taking at most b of them; min_batch <= b so all of them).
        rate(i, idle[n + 1] if n + 1 < min_batch else busy[0], lam)
    for n, i in busy.items():
        if n < n_max:
            rate(i, busy[n + 1], lam)
        # Completion: the server takes the next batch if enough wait, else goes idle.
        if n >= b:
            rate(i, busy[n - b], mu)
        elif n >= min_batch:
            rate(i, busy[0], mu)
        else:
            rate(i, idle[n], mu)
    p = _solve_ctmc(q)
    if p[busy[n_max]] > 1e-10:
        raise ValueError(f"truncation at n_max={n_max} too low (tail mass {p[busy[n_max]]:.2e})")
    waiting = sum(n * p[i] for n, i in idle.items()) + sum(n * p[i] for n, i in busy.items())
    return waiting / lam + 1.0 / mu
