"""ember.cli: the `ember` command, thin subcommands over the library (see main.py)."""
