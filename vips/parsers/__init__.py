"""The `vips` argument parser, one module per group of verbs beside the handlers in vips.commands (which
vips.cli imports only when a verb runs): nothing here loads numpy, so `vips --help` stays fast."""
