"""What happens whatever the strategy: recovery paths per failure signal, rollback, spares, stragglers, people."""

from __future__ import annotations

import pytest

from devheal.simulate.failures import DAY, HOUR
from devheal.simulate.fleet import Loss
from devheal.simulate.strategies import KubernetesDefault, NodeHealthController, PodWatcher

from .builders import fault, run, small_config

GANG_GPUS = 4 * 8
RESTART = 180 + 120  # rendezvous + checkpoint load, then every pod recreated
IN_PLACE = 180 + 20  # rendezvous + checkpoint load, the processes restarted in their pods (an elastic gang)
BACKOFF = 10  # the Job controller's first backoff after a pod failure


@pytest.mark.parametrize(
    ("strategy", "restart", "backoff"),
    [(KubernetesDefault, RESTART, BACKOFF), (NodeHealthController, RESTART, BACKOFF), (PodWatcher, IN_PLACE, 0)],
)
@pytest.mark.parametrize(
    ("cls", "detected", "after_backoff"),
    [
        ("software-bug", 30, True),  # the job exits and its controller restarts it
        ("nccl-watchdog", 600, True),  # hangs until the NCCL watchdog fires
        ("power-supply", 50 + 300, False),  # NotReady, then pods evicted after the toleration
        ("network", HOUR, False),  # nothing points at the node: a person finds it
    ],
)
def test_non_gpu_failures_recover_through_kubernetes_and_people_elastic_gangs_in_place(
    strategy: type, restart: float, backoff: float, cls: str, detected: float, after_backoff: bool
) -> None:
    result = run(small_config(), [fault(2, node=1, cls=cls)], strategy())
    assert result.interruptions == 1
    assert result.recoveries_s == [pytest.approx(detected + (backoff if after_backoff else 0) + restart)]


def test_work_since_the_last_checkpoint_is_lost() -> None:
    # Checkpoints every 900 s: a failure at 3,700 s loses 100 s of all 32 GPUs.
    result = run(small_config(), [fault(3700 / HOUR, node=0, cls="software-bug")], KubernetesDefault())
    assert result.training_loss_gpu_hours[Loss.ROLLBACK] == pytest.approx(100 * GANG_GPUS / HOUR)
    assert result.training_loss_gpu_hours[Loss.AWAITING_REMEDIATION] == pytest.approx((30 + BACKOFF) * GANG_GPUS / HOUR)
    assert result.training_loss_gpu_hours[Loss.RESTART] == pytest.approx(RESTART * GANG_GPUS / HOUR)


def test_silent_data_corruption_rolls_back_to_before_the_corruption() -> None:
    # Corrupt at 1:05, noticed an hour later: everything since the 1:00 checkpoint is lost.
    result = run(small_config(), [fault(1 + 5 / 60, node=2, cls="sdc")], PodWatcher())
    lost = result.training_loss_gpu_hours[Loss.ROLLBACK] * HOUR / GANG_GPUS
    assert lost == pytest.approx(3600 + 300)
    assert result.recoveries_s == [pytest.approx(HOUR + IN_PLACE)]  # the pod watcher's gang is elastic


def test_faults_on_spares_do_not_interrupt_and_faults_on_nodes_in_repair_hit_nothing() -> None:
    config = small_config(spares=2)
    spare = 4
    result = run(config, [fault(1, spare, "network"), fault(3, spare, "faulty-gpu")], KubernetesDefault())
    assert result.interruptions == 0
    assert result.faults_absorbed == 1  # the second one: the node is out for repair (2 days)
    assert result.training_ettr == pytest.approx((DAY - 96 * 20) / DAY)  # only checkpoint pauses


def test_an_empty_spare_pool_makes_the_gang_wait_for_a_repaired_node() -> None:
    config = small_config(spares=0, days=4)
    result = run(config, [fault(1, node=0, cls="gpu-hbm3", reboot_fixes=True)], PodWatcher())
    # Released at 1h + 10 s, but the only node that can replace it comes back after the person's
    # reboot (1h + 1h + 15 min).
    waited = result.training_loss_gpu_hours[Loss.AWAITING_NODE] * HOUR / GANG_GPUS
    assert waited == pytest.approx(HOUR + 900 - 10)
    assert result.min_spares == 0


def test_a_slow_member_slows_the_gang_until_people_swap_it_at_a_checkpoint() -> None:
    config = small_config(days=3)
    result = run(config, [], KubernetesDefault(), slow={1: 1.25})
    # One day at 1/1.25 speed (less checkpoint pauses), then a planned swap with no work lost.
    straggling = result.training_loss_gpu_hours[Loss.STRAGGLERS] * HOUR / GANG_GPUS
    assert straggling == pytest.approx((DAY - 96 * 20) * (1 - 1 / 1.25))
    assert result.remediations == {"people:swap-straggler": 1}
    assert result.training_loss_gpu_hours[Loss.ROLLBACK] == pytest.approx(0.0)
    assert result.recoveries_s == []  # planned: not counted as a recovery


def test_inference_and_batch_units() -> None:
    config = small_config(gang_nodes=0, spares=1, inference=2, batch=1, days=1)
    inference_node, batch_node = 0, 2
    result = run(
        config,
        [fault(1, inference_node, "software-bug"), fault(5.5, batch_node, "software-bug")],
        KubernetesDefault(),
    )
    assert result.training_ettr is None
    # The crashed replica leaves the endpoints; at 1 h demand is ~51% of both replicas, so the other one serves
    # nearly all of it for the 330 s the replica is down.
    assert result.inference_availability is not None
    assert 1 - 1e-4 < result.inference_availability < 1
    # The 4-hour batch job that started at 4h loses 1.5 h, then 30 s + the backoff + 60 s to restart.
    assert result.batch_goodput == pytest.approx(1 - (1.5 * HOUR + 30 + BACKOFF + 60) / DAY)
