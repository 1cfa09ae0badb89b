"""The error every structured-output check raises."""


class SchemaError(ValueError):
    """A constraint ember cannot enforce (a schema keyword, a regular expression); the message names it and the fix."""
