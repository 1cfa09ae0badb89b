"""ember.parallel: tensor, sequence, pipeline and expert parallelism over torch.distributed (gloo on CPU).

Rank 0 is the engine process: it schedules, broadcasts each step's plan to the worker ranks,
runs its own part of the forward pass, and samples. Workers (ember.parallel.worker) hold their
shard of the weights and of the KV cache and follow the plan. What a rank holds is its
`ModelShard` (sharding.py: tensor parallel; pipeline.py: a stage's layers; expert.py: a range of
experts), picked from the `ParallelConfig` by modes.py; the layers that talk to the other ranks
live in ember.layers (parallel, sequence_parallel, pipeline, expert_parallel). No transport of
our own: every byte between ranks goes through a gloo process group (communicator.py), counted
per collective, and volume.py states what each mode must send per token.
"""
