"""A node's mark before the evictions from it: the replacements are scheduled knowing the mark.

A round that decides a taint (or a cordon, a degraded fence or taint) on a node and an eviction, a failed pod or
a gang restart of a pod on that node starts the mark first (``Plan.actions``); the work queue then runs both at
once. Without an order the eviction often wins: the Deployment's replacement is scheduled onto the node with the
failed GPU before the taint lands (seen on the lab's real kubelet). So the work that replaces a pod waits for the
mark's first attempt to end, whatever its outcome: a mark that fails does not hold an eviction back.

The held work takes no worker while it waits; it is queued when the mark's attempt ends. Nothing here is kept
across leadership: a new leader's rounds decide again from the records.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

Work = Callable[[], Awaitable[None]]


class MarksFirst:
    """Node -> the mark devheal is putting on it now, and the work waiting for it."""

    def __init__(self, submit: Callable[[str, Work], None]) -> None:
        self._submit = submit
        self._marking: dict[str, str] = {}
        """Node -> the name of the mark whose attempt is under way."""
        self._waiting: dict[str, list[tuple[str, Work]]] = {}
        self._held: set[str] = set()

    def __contains__(self, key: object) -> bool:
        """Whether the work of ``key`` waits for a mark (it is not in the work queue yet)."""
        return key in self._held

    def marking(self, node: str, name: str) -> None:
        """The mark ``name`` on ``node`` is queued: work replacing the node's pods waits for it from now on."""
        self._marking[node] = name

    def marked(self, node: str, name: str) -> None:
        """The attempt of the mark ``name`` ended: the work that waited for it is queued."""
        if self._marking.get(node) != name:
            return
        del self._marking[node]
        for key, work in self._waiting.pop(node, ()):
            self._held.discard(key)
            self._submit(key, work)

    def hold(self, node: str, key: str, work: Work) -> bool:
        """Keep ``work`` until the mark under way on ``node`` ends; False (nothing kept): there is none."""
        if node not in self._marking:
            return False
        self._waiting.setdefault(node, []).append((key, work))
        self._held.add(key)
        return True

    def clear(self) -> None:
        """Leadership lost or the workers restarted: the work that waited is dropped with the queue's."""
        self._marking.clear()
        self._waiting.clear()
        self._held.clear()
