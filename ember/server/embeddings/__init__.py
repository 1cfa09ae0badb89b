"""`POST /v1/embeddings`: the handler over the serving core."""
