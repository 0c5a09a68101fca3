"""Stalled gangs judged by where each rank is: inside a collective or outside every one (``collective_marks``).

The shapes are those measured on real PyTorch gangs (4 ranks, gloo; docs/gangs.md#real-pytorch-gangs-measured):
each rank reports its own forward compute before the backward pass, and a step is about 0.08 s between reports.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from devheal.engine.collective_marks import waits_inside
from devheal.engine.stragglers import StragglerTracker, stall
from devheal.model.cluster import Pod
from devheal.model.plan import FindingKind
from devheal.model.steps import StepReport
from devheal.model.straggler_policy import StragglerRules
from devheal.simulate.step_streams import EPOCH, GangStream

from .builders import policy

T = EPOCH + 1000.0
STEP = 0.08
NOW = T + 11.0
"""When the stall is judged: 11 s after the last step, past the 10 s the bench's policy allows."""

Mark = tuple[float, int, int, float | None]
"""A rank's last step, collectives entered, left, and since when it is inside one (None: outside)."""


def gang(marks: list[Mark | tuple[float, int, None, None]]) -> list[Pod]:
    """Four (or more) running ranks of one run with these last steps and collective marks (``exits`` None: the rank
    marks no exits, as older training loops)."""
    stream = GangStream(ranks=len(marks), noise=0.0)
    view = next(iter(stream.views(1)))
    pods = sorted(view.pods.values(), key=lambda p: p.name)
    return [
        replace(
            p,
            steps=StepReport(100, 10, 0.005, last, EPOCH, interval=STEP, collectives=count, exits=exits, inside=inside),
        )
        for p, (last, count, exits, inside) in zip(pods, marks, strict=True)
    ]


def unmarked(members: list[Pod]) -> list[Pod]:
    """The same ranks as an older training loop reports them: entries counted, no exit marked."""
    out = []
    for p in members:
        assert p.steps is not None
        out.append(replace(p, steps=replace(p.steps, exits=None, inside=None)))
    return out


def inside_a_collective(pod: Pod, now: float) -> Pod:
    """The rank as it is most of the time: inside a collective, waiting for its peers."""
    if pod.steps is None:
        return pod
    return replace(pod, steps=replace(pod.steps, collectives=100, exits=99, inside=now - 0.01))


def named(members: list[Pod]) -> str:
    f = stall(members, StragglerRules(), NOW + 40.0)  # past the default 45 s too
    assert f is not None and f.kind is FindingKind.GANG_STALLED
    return f.pod if f.pod_uid else ""


def evidence(members: list[Pod]) -> str:
    f = stall(members, StragglerRules(), NOW + 40.0)
    assert f is not None
    return f.evidence


def test_ddp_network_cut_names_no_healthy_rank_waiting_inside_the_all_reduce() -> None:
    """Measured: rank 1 cut off. Gloo's ring all-reduce had finished step k for the ranks that got their chunks before
    the cut; they reported step k+1 and wait in its all-reduce. Rank 0, the cut rank's ring neighbour, still waits in
    step k's: its last step is a step older, and the step rule named it, a healthy rank."""
    members = gang(
        [
            (T - STEP, 107, 106, T - STEP + 0.005),  # rank 0: inside step k's all-reduce
            (T, 108, 107, T + 0.005),  # rank 1, cut: inside step k+1's (its chunks of step k had arrived)
            (T, 108, 107, T + 0.005),
            (T, 108, 107, T + 0.004),
        ]
    )
    assert named(unmarked(members)) == "train/llm-0", "the shape that named a healthy rank without exit marks"
    assert named(members) == ""
    assert "every rank waits inside a collective (for 51s), each for a peer" in evidence(members)


def test_fsdp_network_cut_names_nobody_either() -> None:
    members = gang([(T, 220, 219, T + 0.02), (T, 220, 219, T + 0.03), (T, 219, 218, T + 0.01), (T, 220, 219, T)])
    assert named(members) == ""


def test_a_rank_hung_in_its_compute_is_outside_while_its_peers_wait_and_is_named() -> None:
    """DDP: the rank stopped at the start of step k+1's compute, after leaving step k's all-reduce; its peers
    reported step k+1 and wait in its all-reduce."""
    ddp = gang(
        [(T, 108, 107, T + 0.005), (T, 108, 107, T + 0.004), (T - STEP, 107, 107, None), (T, 108, 107, T + 0.006)]
    )
    assert named(ddp) == "train/llm-2"
    assert (
        "rank train/llm-2 stalled first: it is outside every collective (entered 107, left 107), while 3 of 4 ranks "
        "wait inside one (for 51s)"
    ) in evidence(ddp)
    # FSDP: every rank reported the same step; the peers wait in the next layer's all-gather.
    fsdp = gang([(T, 101, 100, T + 0.01), (T, 101, 100, T + 0.01), (T, 101, 100, T + 0.02), (T, 90, 90, None)])
    assert named(fsdp) == "train/llm-3"


def test_a_stopped_rank_is_named_when_its_last_post_says_it_was_outside() -> None:
    """SIGSTOP: the posting thread stops with the process, so its marks stay as it last posted them (up to 0.5 s
    old). Measured under DDP: it had entered 107 collectives, its peers 115."""
    outside = gang(
        [(T, 115, 114, T + 0.01), (T - 0.6, 107, 107, None), (T, 115, 114, T + 0.01), (T, 115, 114, T + 0.02)]
    )
    assert named(outside) == "train/llm-1"
    # Last posted from inside a collective: indistinguishable from a rank waiting for a peer; nobody is named and
    # the gang restarts in place (the count rule alone would have named it).
    inside = gang(
        [(T, 115, 114, T + 0.01), (T - 0.6, 107, 106, T - 0.6), (T, 115, 114, T + 0.01), (T, 115, 114, T + 0.02)]
    )
    assert named(unmarked(inside)) == "train/llm-1"
    assert named(inside) == ""


def test_a_slow_rank_with_exit_marks_is_still_a_straggler() -> None:
    """Marks change only how a stall is judged: a rank 2x slower stands out in its own compute as before."""
    stream = GangStream(ranks=4, slowdown={3: 2.0}, noise=0.0)
    tracker = StragglerTracker()
    found: set[str] = set()
    for view in stream.views(12):
        view = replace(view, pods={k: inside_a_collective(p, stream.now) for k, p in view.pods.items()})
        found |= {
            f.pod
            for f in tracker.observe(view, [policy(actions={"gang": "RestartGang"})], stream.now)
            if f.kind is FindingKind.STRAGGLER
        }
    assert found == {"train/llm-3"}


def test_only_a_minority_outside_while_the_rest_wait_inside_is_named() -> None:
    # Half or more outside: nothing says which of them the others wait for (or an unmarked wait).
    half = gang([(T, 10, 10, None), (T, 10, 10, None), (T, 11, 10, T), (T, 11, 10, T)])
    assert named(half) == ""
    assert "no rank stalled first: 2 of 4 ranks are outside every collective, 2 wait inside one" in evidence(half)
    assert named(gang([(T, 10, 10, None)] * 4)) == ""
    # Two ranks: one outside, one inside is half.
    assert named(gang([(T - 1, 10, 10, None), (T, 11, 10, T)])) == ""
    # Two of eight outside: the one whose last step is oldest is named, and the other counted.
    eight = gang([(T, 11, 10, T)] * 3 + [(T, 10, 10, None), (T - STEP, 10, 10, None)] + [(T, 11, 10, T)] * 3)
    assert named(eight) == "train/llm-4"
    assert "(and 1 more outside)" in evidence(eight)


def test_where_only_some_ranks_mark_exits_a_rank_inside_a_collective_is_never_named() -> None:
    # Ranks 0 and 1 mark exits, 2 and 3 count entries only: the step rule judges, but its pick waits for a peer.
    mixed = gang([(T - STEP, 107, 106, T - STEP), (T, 108, 107, T), (T, 108, None, None), (T, 108, None, None)])
    assert named(mixed) == ""
    assert (
        "no rank stalled first: rank train/llm-0 looked so (its last step 51s ago, the others' at most 51s ago), but "
        "it waits inside a collective (for 51s), for a peer"
    ) in evidence(mixed)
    # Its pick outside, or marking no exits: named as before.
    assert named(gang([(T - STEP, 107, 107, None), (T, 108, 107, T), (T, 108, None, None), (T, 108, None, None)])) == (
        "train/llm-0"
    )
    assert named(gang([(T, 108, 107, T), (T, 108, 107, T), (T - STEP, 107, None, None), (T, 108, None, None)])) == (
        "train/llm-2"
    )


def test_without_exit_marks_the_step_and_count_rules_judge_unchanged() -> None:
    members = gang([(T, 120, None, None), (T, 120, None, None), (T, 119, None, None), (T, 120, None, None)])
    assert named(members) == "train/llm-2"
    assert "it entered 119 collectives, 3 of 4 ranks 120" in evidence(members)


@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 2.0),  # how long before T the rank's last step came
            st.integers(0, 3),  # collectives behind the most
            st.booleans(),  # marks exits
            st.booleans(),  # inside a collective
        ),
        min_size=1,
        max_size=8,
    )
)
def test_a_rank_inside_a_collective_is_never_named(shape: list[tuple[float, int, bool, bool]]) -> None:
    marks: list[Mark | tuple[float, int, None, None]] = []
    for ago, behind, marked, inside in shape:
        count = 100 - behind
        if not marked:
            marks.append((T - ago, count, None, None))
        elif inside:
            marks.append((T - ago, count, count - 1, T - ago))
        else:
            marks.append((T - ago, count, count, None))
    members = gang(marks)
    f = stall(members, StragglerRules(), NOW + 40.0)
    assert f is not None
    if f.pod_uid:
        pod = next(p for p in members if p.uid == f.pod_uid)
        assert pod.steps is not None and not waits_inside(pod.steps), f.evidence
