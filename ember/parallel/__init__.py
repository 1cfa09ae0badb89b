"""ember.parallel: tensor parallelism over torch.distributed (gloo on CPU), driven by the engine process.

Rank 0 is the engine process: it schedules, broadcasts each step's plan to the worker ranks,
runs its own shard of the forward pass, and samples. Workers (ember.parallel.worker) hold
their shard of the weights and of the KV cache and follow the plan. No transport of our own:
every byte between ranks goes through a gloo process group (ember.parallel.communicator).
"""
