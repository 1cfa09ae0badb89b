"""`POST /v1/chat/completions` (chat.py) and `POST /v1/completions` (text.py): the handlers over the serving core."""
