"""Test support for the shell (devheal.kube, devheal.controller): an in-memory API server and virtual time."""
