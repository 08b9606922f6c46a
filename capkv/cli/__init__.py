"""The ``capkv`` command line: one module per subcommand, dispatched by :mod:`capkv.cli.main`."""
