"""Serving rules as plain functions and small classes over plain state.

A rule here decides something every engine must decide the same way, and holds no clock,
no event queue and no engine object: the engine that calls it (the simpy reference engine,
the live server) keeps its own state and asks the rule. New rules are written here once.

* :mod:`.prefix_cache` — automatic prefix caching: which of a prompt's prefix blocks an
  engine holds, what a prompt's prefill then costs, which blocks are evicted.
* :mod:`.queue` — micro-batch queues: when a queue releases a batch to which idle worker
  (the forming rule, the batching policy, flush timers), and its limits (``max_queue``,
  ``queue_timeout``).
* :mod:`.continuous` — continuous batching: an engine's state, its running rows' tokens and
  KV blocks, and the iteration boundary (preemption, admission, an iteration's end).
* :mod:`.service` — a task's service model, the scenario's overrides applied, made once.
"""
