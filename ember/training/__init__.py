"""Training the draft heads speculative decoding reads (Medusa heads, an EAGLE head) from a target model's own text.

Above the engine: it generates the target's replies through `ember.llm.LLM` and runs the target's forward
passes through the engine's runner; the trained heads are files the engine's proposers load
(ember.engine.spec.medusa_heads, ember.engine.spec.eagle_head).
"""
