"""Bearer tokens that rotate: the token file is read again when it changes.

In a pod, bound service-account tokens expire (after an hour by default) and the kubelet
rewrites the projected token file well before that; a kubeconfig user may name a
``tokenFile`` for the same reason (the file then wins over an inline ``token``, as in
client-go). kubernetes_asyncio reads the token once (its in-cluster refresh hook runs only
inside its generated API classes, which we do not use), so ``KubeClient`` asks a
``TokenFile`` for the header of every request: the file's identity (inode, size, mtime) is
checked at most every ``check_every`` seconds and the token read again when it changed;
after a 401 the client reloads at once and retries the request once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
IN_CLUSTER_CA = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
CHECK_EVERY = 5.0
"""Seconds between two looks at the token file (a stat; the file is read only when it changed)."""


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


class TokenFile:
    """The bearer token in ``path``, as fresh as the file (checked at most every ``check_every`` seconds)."""

    def __init__(
        self, path: Path, *, check_every: float = CHECK_EVERY, clock: Callable[[], float] = _loop_time
    ) -> None:
        self.path = path
        self.check_every = check_every
        self._clock = clock
        self._checked: float | None = None
        self._stamp: tuple[int, int, int] | None = None
        self.token = ""
        self.reads = 0
        """How many times the file was read (tests, logs)."""
        if not self._read():
            raise OSError(f"cannot read the token file {path}")

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _read(self) -> bool:
        """Read the file; on failure (missing while being swapped, empty) keep the token we have."""
        stamp = self._identity()
        try:
            token = self.path.read_text().strip()
        except OSError as exc:
            log.warning("cannot read the token file %s (%s); keeping the previous token", self.path, exc)
            return False
        if not token:
            log.warning("the token file %s is empty; keeping the previous token", self.path)
            return False
        self.reads += 1
        if self.token and token != self.token:
            log.info("bearer token reloaded from %s", self.path)
        self.token = token
        self._stamp = stamp
        return True

    def authorization(self) -> str:
        """The ``Authorization`` header's value for the next request."""
        now = self._clock()
        if self._checked is None or now - self._checked >= self.check_every:
            self._checked = now
            if self._identity() != self._stamp:
                self._read()
        return f"Bearer {self.token}"

    def reload(self) -> bool:
        """Read the file now (the server refused the token); whether the token changed."""
        before = self.token
        self._read()
        return self.token != before
