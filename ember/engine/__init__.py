"""ember.engine: requests in, one step at a time, deltas out (scheduler, model runner, step loop).

`LLMEngine` runs the loop on the caller's thread; `EngineProcessClient` runs it in a process of its own
(what `ember serve` uses). See README.md beside this file.
"""
