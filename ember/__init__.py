"""ember: LLM inference and serving."""
