"""The order of the reference engine's events at one instant (:mod:`simulator.model.kernel`
says why it is part of the model): lower first. Plain integers (simpy's own priorities are),
so that the modules naming them import no simpy: a run on the compiled kernel never loads it.
"""

#: A batch finishes and frees its GPU (or CPU server) and its worker.
COMPLETION = 0
#: A call arrives and its prompts join their queues.
ARRIVAL = 1
#: A flush window expires and the queue decides whether to release a batch.
TIMER = 2
