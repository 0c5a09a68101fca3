"""MarksFirst: work replacing a node's pods waits for devheal's mark on that node, and only for that."""

from __future__ import annotations

from devheal.controller.mark_order import MarksFirst, Work


async def _nothing() -> None:
    return None


def _queue() -> tuple[MarksFirst, list[str]]:
    submitted: list[str] = []

    def submit(key: str, work: Work) -> None:
        submitted.append(key)

    return MarksFirst(submit), submitted


def test_the_eviction_is_queued_when_the_marks_attempt_ends() -> None:
    order, submitted = _queue()
    order.marking("n1", "taint-n1")
    assert order.hold("n1", "deschedule-p", _nothing)
    assert order.hold("n1", "failpod-q", _nothing)
    assert "deschedule-p" in order and submitted == []
    order.marked("n1", "taint-n1")
    assert submitted == ["deschedule-p", "failpod-q"]
    assert "deschedule-p" not in order
    order.marked("n1", "taint-n1")  # a retry of the mark's attempt queues nothing again
    assert submitted == ["deschedule-p", "failpod-q"]


def test_nothing_waits_on_another_node_or_after_the_mark() -> None:
    order, submitted = _queue()
    order.marking("n1", "taint-n1")
    assert not order.hold("n2", "deschedule-p", _nothing)
    order.marked("n1", "taint-n1")
    assert not order.hold("n1", "deschedule-q", _nothing)
    assert submitted == []


def test_a_later_mark_on_the_node_is_the_one_waited_for() -> None:
    order, submitted = _queue()
    order.marking("n1", "taint-n1")
    order.marking("n1", "cordon-n1")
    assert order.hold("n1", "deschedule-p", _nothing)
    order.marked("n1", "taint-n1")
    assert submitted == []
    order.marked("n1", "cordon-n1")
    assert submitted == ["deschedule-p"]


def test_losing_leadership_drops_what_waited() -> None:
    order, submitted = _queue()
    order.marking("n1", "taint-n1")
    assert order.hold("n1", "deschedule-p", _nothing)
    order.clear()
    assert "deschedule-p" not in order
    order.marked("n1", "taint-n1")  # the cancelled attempt's end
    assert submitted == []
    assert not order.hold("n1", "deschedule-q", _nothing)
