"""The ``devheal`` command line."""
