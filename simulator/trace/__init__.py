"""Traces: recorded or synthetic arrivals of API calls, each carrying prompts.

* :mod:`simulator.trace.model` — the in-memory :class:`Trace`, :class:`Call`, :class:`Prompt`;
* :mod:`simulator.trace.formats` — reading and writing files (client and native formats);
* :mod:`simulator.trace.classify` — keyword rules that give a prompt text its task;
* :mod:`simulator.trace.stats` — the statistics ``simctl validate`` prints;
* :mod:`simulator.trace.synth` — synthetic traces from stated statistics.
"""

from simulator.trace.model import Call, Prompt, Trace

__all__ = ["Call", "Prompt", "Trace"]
