"""Console plumbing: how a command body becomes a console script and what each command says to ``--help``."""
