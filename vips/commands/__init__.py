"""The handlers of the `vips` verbs: each takes the parsed arguments and returns the exit code."""
