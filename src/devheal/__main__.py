"""``python -m devheal``: the same as the ``devheal`` command."""

from devheal.cli.app import main

main()
