"""One module per family of generated tables; each registers its tables and figure sources
(:mod:`reporting.registry`). A new study is a new module here: nothing else is edited."""
