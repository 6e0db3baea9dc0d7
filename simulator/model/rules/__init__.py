"""Serving rules as plain functions and small classes over plain state.

A rule here decides something every engine must decide the same way, and holds no clock,
no event queue and no engine object: the engine that calls it (the simpy reference engine,
the live server) keeps its own state and asks the rule. New rules are written here once.

* :mod:`.prefix_cache` — automatic prefix caching: which of a prompt's prefix blocks an
  engine holds, what a prompt's prefill then costs, which blocks are evicted.
"""
