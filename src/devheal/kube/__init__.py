"""Everything that talks to the Kubernetes API server, and keeps the loops that do alive.

The only package that imports a Kubernetes client library. Besides the client, its errors
and the reflectors: ``supervision`` (a crashed long-running loop starts again) and
``probes`` (the metrics port's ``/healthz`` and ``/readyz``), which every process of
devheal that runs such loops uses.
"""
