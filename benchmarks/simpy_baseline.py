"""The yardstick every speed figure is divided by: an idiomatic simpy M/M/c, run in the same
process just before the measurement, so a figure reads "N times the speed of plain simpy on
this machine, now" and survives a noisy or slower machine.

The model is the one simpy's own examples write: one process per customer that requests a
``simpy.Resource`` of ``c`` servers, holds it for an exponential service time and releases
it; a source process spawns customers at exponential gaps. Waits are recorded per customer,
so the baseline pays for its results as simctl pays for its event log.

Speeds are customers per second of CPU time (``time.process_time``), so a machine shared with
other work gives the same figure. ``--once`` runs the model once and prints nothing: a whole
command (start-up, imports, the inputs drawn, the run) whose CPU time a parent measures.

    python benchmarks/simpy_baseline.py            # customers per second, M/M/4 at load 0.8
    python benchmarks/simpy_baseline.py --once --customers 200000
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def mmc_inputs(customers: int, servers: int, load: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Arrival instants and service times of an M/M/c at utilisation ``load`` (mean service 1 s)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / (load * servers), customers)
    return np.cumsum(gaps), rng.exponential(1.0, customers)


def simpy_mmc(arrivals: np.ndarray, services: np.ndarray, servers: int) -> np.ndarray:
    """Each customer's wait in queue, simulated the idiomatic simpy way."""
    import simpy

    env = simpy.Environment()
    desk = simpy.Resource(env, capacity=servers)
    waits = np.empty(len(arrivals))

    def customer(i: int, service: float):
        arrived = env.now
        with desk.request() as turn:
            yield turn
            waits[i] = env.now - arrived
            yield env.timeout(service)

    def source():
        for i, (at, service) in enumerate(zip(arrivals.tolist(), services.tolist(), strict=True)):
            yield env.timeout(at - env.now)
            env.process(customer(i, service))

    env.process(source())
    env.run()
    return waits


def simpy_customers_per_second(customers: int = 200_000, servers: int = 4, load: float = 0.8,
                               seed: int = 0, repeat: int = 1) -> float:
    """Customers per second of CPU time of :func:`simpy_mmc` (best of ``repeat``)."""
    arrivals, services = mmc_inputs(customers, servers, load, seed)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        simpy_mmc(arrivals, services, servers)
        best = min(best, time.process_time() - t0)
    return customers / best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--customers", type=int, default=200_000)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--once", action="store_true", help="run the model once, print nothing")
    args = parser.parse_args(argv)
    if args.once:
        simpy_mmc(*mmc_inputs(args.customers, args.servers, 0.8, args.seed), args.servers)
        return 0
    rate = simpy_customers_per_second(args.customers, args.servers, seed=args.seed, repeat=args.repeat)
    print(f"idiomatic simpy M/M/{args.servers}: {rate:,.0f} customers/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
