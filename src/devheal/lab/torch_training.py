"""A small PyTorch training job for the lab: one rank per process, on the CPU with gloo.

    python -m devheal.lab.torch_training --shape ddp --checkpoint-dir DIR [--events FILE]

Each rank is started the way torchrun starts a worker (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` in the environment), typically under ``devheal launch``.
Two shapes of synchronous training:

- ``ddp``: DistributedDataParallel, one gradient all-reduce per step (in the backward pass);
- ``fsdp``: FSDP2 (``fully_shard`` per layer): all-gathers inside the forward and backward
  passes, a reduce-scatter per layer in the backward pass.

It checkpoints every ``--checkpoint-every`` steps to local disk (one file per rank, written
atomically; a step counts once every rank's file is there) and resumes from the newest
complete checkpoint when it starts, so a restarted gang loses only the steps since then. It
reports each step to the launcher with ``devheal.launch.report_step`` as docs/stragglers.md
asks: the rank's own compute, collective waits excluded, before the backward pass. Each layer's
forward is timed (the training thread's CPU time: the lab's ranks share a few cores) by hooks
(``OwnCompute``): with FSDP they are registered after ``fully_shard``,
so they run after FSDP's pre-forward has waited for the layer's all-gather and before its
post-forward; the step reports the sum. It marks the collectives it enters and leaves
(``devheal.launch.enter_collective``, ``leave_collective``, ``collective``), so its launcher
publishes whether it is inside one, waiting for its peers: with FSDP, each layer's forward
all-gather from a hook that runs before FSDP's pre-forward to one that runs after it, and the
whole backward pass (all-gathers and reduce-scatters in every layer, no hook between them and the
layer's own compute); with DDP, each gradient bucket's all-reduce from the communication hook
that starts it to the completion of its future. Each run reports reaching the rendezvous store
(``report_joined``) before it sets up gloo. A lab fault that slows the rank's GPUs
(``DEVHEAL_LAB_DEVICES``/``DEVHEAL_LAB_POD``, ``devheal.lab.slowdown``) stretches each layer's own
forward, where the compute is measured.

Lab faults reach it as signals: SIGUSR1 exits with ``--device-error-exit-code`` (a loop that
caught a CUDA/NCCL device error), SIGUSR2 makes its training thread hang at the start of its
next step's compute (``HangInCompute``).

``--events FILE`` appends one JSON line per event (``start``, ``joined``, ``resumed``,
``step``, ``checkpoint``) with the wall time and the process's ``run`` (a random name: in a
container every run's pid is 1), for benchmarks that measure a recovery; ``start`` (once torch is
imported) also says when the process itself started (``process_started``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from devheal.lab.slowdown import PodSlowdown
from devheal.launch import collective, enter_collective, leave_collective, report_joined, report_step

SHAPES = ("ddp", "fsdp")


class Events:
    """The rank's event log (one JSON object a line), or nowhere."""

    def __init__(self, path: str | None, rank: int) -> None:
        self.path = Path(path) if path else None
        self.rank = rank
        # Names this process among every rank's runs: in a container the pid is the same (1) in every run.
        self.run = os.urandom(6).hex()

    def __call__(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps(
            {"t": time.time(), "event": event, "rank": self.rank, "pid": os.getpid(), "run": self.run, **fields}
        )
        with self.path.open("a") as f:
            f.write(line + "\n")


class HangInCompute:
    """SIGUSR2: the rank hangs in its next step's compute, before that step's first collective (the lab's stand-in
    for a kernel that never returns, or a read that never completes); a SIGSTOP from outside lands anywhere in a step.

    Only the training thread blocks, as it would on a kernel or a read: the process lives on, and so does the thread
    that posts its collective marks to the launcher ("outside every collective"). Stopping the whole process here (as
    this did before) froze that thread too, leaving the rank's last posted mark to chance, which is the ``hang``
    fault's case. A signal still ends it (SIGTERM's handler runs between the sleeps)."""

    def __init__(self) -> None:
        self.armed = False

    def arm(self, *_: object) -> None:
        self.armed = True

    def here(self) -> None:
        if self.armed:
            self.armed = False
            while True:
                time.sleep(3600)


def _process_started() -> float | None:
    """When this process started (its exec, before the interpreter and torch loaded), wall time; None where
    /proc cannot tell."""
    try:
        since_boot = int(Path("/proc/self/stat").read_text().rsplit(") ", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - since_boot)


class OwnCompute:
    """Times each layer's own forward, waits in collectives excluded, and stretches it under a lab slowdown.

    The time is the training thread's CPU time (``time.thread_time``), not the wall clock: the lab's ranks share
    a few cores, and a rank the OS runs less often would look slow by the wall clock (measured: 8 ranks on 2 cores
    gave healthy ranks 1.8x medians and named them stragglers), where each real rank has a GPU of its own. A
    training loop on GPUs times its layers with CUDA events instead (docs/gangs.md).

    Hooks on each layer: FSDP2's ``fully_shard`` registers its pre-forward (unshard: the all-gather, and the wait
    for it) prepended and its post-forward (reshard) appended, so a pre-hook appended after ``fully_shard`` starts
    the clock once the layer's parameters are there, and a post-hook prepended stops it before the reshard. With
    ``mark_collectives`` a pre-hook prepended ahead of FSDP's marks the entry into the all-gather the layer is
    about to wait for, and the appended pre-hook its exit.
    """

    def __init__(self) -> None:
        self.total = 0.0
        """Seconds of own forward compute in this step so far."""
        self.factor = 1.0
        self.layers: list[float] = []
        """This step's per-layer times (seconds), in forward order."""
        self._began = 0.0
        self.handles: list[RemovableHandle] = []

    def attach(self, layers: Sequence[nn.Module], *, mark_collectives: bool) -> None:
        for layer in layers:
            if mark_collectives:
                self.handles.append(layer.register_forward_pre_hook(self._enter_collective, prepend=True))
                self.handles.append(layer.register_forward_pre_hook(self._leave_collective))
            self.handles.append(layer.register_forward_pre_hook(self._start))
            self.handles.append(layer.register_forward_hook(self._stop, prepend=True))

    def new_step(self, factor: float) -> None:
        self.total = 0.0
        self.layers = []
        self.factor = factor

    def _enter_collective(self, *_: object) -> None:
        enter_collective()

    def _leave_collective(self, *_: object) -> None:
        leave_collective()

    def _start(self, *_: object) -> None:
        self._began = time.thread_time()

    def _stop(self, *_: object) -> None:
        took = time.thread_time() - self._began
        if self.factor > 1.0:
            # A slowed GPU: the layer's own compute takes longer. Spun for CPU time, not slept: a sleep on a busy
            # machine oversleeps by whole scheduler slices (1.3x measured as 3.6x).
            until = time.thread_time() + took * (self.factor - 1.0)
            while time.thread_time() < until:
                pass
            took = time.thread_time() - self._began
        self.layers.append(took)
        self.total += took


def _model(width: int, layers: int) -> nn.Sequential:
    torch.manual_seed(0)  # every rank starts from the same weights, as a broadcast would give
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(width, 1))


def _marked_allreduce(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's own all-reduce of a gradient bucket, with its entry marked when it starts and its exit when its future
    completes (on gloo's thread), failed or not: the rank is inside from the first bucket to the last one's end."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    enter_collective()
    try:
        future = allreduce_hook(None, bucket)  # type: ignore[arg-type]  # None: the default process group
    except BaseException:
        leave_collective()
        raise

    def left(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        leave_collective()
        return done.value()

    return future.then(left)


# DDP checks a hook's annotations against the types themselves; this module's are strings (postponed evaluation).
_marked_allreduce.__annotations__.update(bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]})


def _wrap(model: nn.Sequential, shape: str) -> nn.Module:
    if shape == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(None, _marked_allreduce)
        return ddp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _checkpoint_steps(root: Path, world: int) -> list[int]:
    """Steps for which every rank's checkpoint file exists, oldest first."""
    steps = []
    for d in root.glob("step-*"):
        try:
            step = int(d.name.removeprefix("step-"))
        except ValueError:
            continue
        if all((d / f"rank-{r}.pt").exists() for r in range(world)):
            steps.append(step)
    return sorted(steps)


def _save(root: Path, step: int, rank: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    d = root / f"step-{step}"
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".rank-{rank}.pt.tmp"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
    tmp.replace(d / f"rank-{rank}.pt")


def _resume(root: Path, rank: int, world: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the newest checkpoint every rank has; the step to run next (0: none).

    Every rank must resume from the same step: the ranks agree on the smallest of their newest
    complete checkpoints (an all-reduce), since a rank may see a checkpoint another wrote late."""
    steps = _checkpoint_steps(root, world)
    mine = torch.tensor([steps[-1] if steps else -1], dtype=torch.int64)
    dist.all_reduce(mine, op=dist.ReduceOp.MIN)
    step = int(mine.item())
    if step < 0:
        return 0
    state = torch.load(root / f"step-{step}" / f"rank-{rank}.pt", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return step + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devheal.lab.torch_training", description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="ddp")
    parser.add_argument("--checkpoint-dir", required=True, help="local directory for the checkpoints")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints (default 20)")
    parser.add_argument("--steps", type=int, default=0, help="stop after this step (0: run until stopped)")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=300.0, help="gloo's collective timeout, seconds")
    parser.add_argument("--events", help="append one JSON line per event to this file")
    parser.add_argument("--layer-times", action="store_true", help="add each layer's own forward time to step events")
    parser.add_argument(
        "--device-error-exit-code",
        type=int,
        default=79,
        help="on SIGUSR1, exit with this code: the lab's stand-in for a loop that caught a CUDA/NCCL device error",
    )
    args = parser.parse_args(argv)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    events = Events(args.events, rank)
    events("start", restarts=int(os.environ.get("DEVHEAL_LAUNCHER_RESTARTS", "0")), process_started=_process_started())
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))  # stop at once: the last checkpoint stands
    signal.signal(signal.SIGUSR1, lambda *_: os._exit(args.device_error_exit_code))
    hang = HangInCompute()
    signal.signal(signal.SIGUSR2, hang.arm)
    torch.set_num_threads(1)
    os.umask(0)  # the lab's ranks run as their nodes' users and share one checkpoint directory
    timeout = datetime.timedelta(seconds=args.timeout)
    # The rendezvous store first, then the report that this rank reached it: a rank whose network is cut never
    # does, while its peers did (docs/stragglers.md). Rank 0 hosts the store and does not wait for the others here.
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0, timeout, wait_for_workers=False
    )
    report_joined()
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    events("joined")
    model = _wrap(_model(args.width, args.layers), args.shape)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    root = Path(args.checkpoint_dir)
    step = _resume(root, rank, world, model, optimizer)
    events("resumed", step=step)
    slowdown = PodSlowdown.from_env()
    compute = OwnCompute()
    # The layers FSDP shards (each its own all-gather); under DDP the same layers, timed alike.
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    compute.attach(layers, mark_collectives=args.shape == "fsdp")
    data = torch.Generator().manual_seed(rank)
    while args.steps == 0 or step <= args.steps:
        compute.new_step(slowdown.factor())
        hang.here()
        x = torch.randn(args.batch, args.width, generator=data)
        loss = model(x).pow(2).mean()
        # The rank's own forward compute, reported before the backward pass (DDP's all-reduce, FSDP's
        # all-gathers and reduce-scatters): a rank that hangs before it has not reported the step its peers
        # did, and one that is slow reports a longer step (docs/stragglers.md).
        report_step(compute.total, step)
        if args.shape == "fsdp":
            with collective():  # all-gathers and reduce-scatters in every layer's backward
                loss.backward()
        else:
            loss.backward()  # the all-reduces are marked by the communication hook
        optimizer.step()
        optimizer.zero_grad()
        events("step", step=step, **({"layers": [round(t, 6) for t in compute.layers]} if args.layer_times else {}))
        if step > 0 and step % args.checkpoint_every == 0:
            _save(root, step, rank, model, optimizer)
            events("checkpoint", step=step)
        step += 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
