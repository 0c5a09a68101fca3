"""Everything that talks to the Kubernetes API server.

The only package that imports a Kubernetes client library.
"""
