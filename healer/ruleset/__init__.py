"""Rule files: the schema (``schema``) and loading with file:line errors (``loading``)."""
