"""A fake training loop for launcher tests: ``trainer.py STARTS_FILE MODE``.

Appends ``start <time> <pid> <launcher address>`` to STARTS_FILE when it starts, reports a
step every 50 ms (and, with ``$TRAINER_CHECKPOINT_EVERY`` set, a checkpoint every that many steps,
appending ``checkpoint <time> <pid> -``), and on SIGTERM takes 0.5 s (a checkpoint) before it appends ``stop`` and
exits 0. MODE ``exitN`` exits with code N after a few steps instead. With
``$DEVHEAL_LAB_DEVICES`` and ``$DEVHEAL_LAB_POD`` set, each step takes as much longer as the
lab's GPUs of that pod are slowed (``faults.degrade``; ``devheal.lab.slowdown``).
"""

import os
import signal
import sys
import time

from devheal.lab.slowdown import PodSlowdown
from devheal.launch import report_checkpoint, report_step

checkpoint_every = int(os.environ.get("TRAINER_CHECKPOINT_EVERY", "0"))

path, mode = sys.argv[1], sys.argv[2]


def append(line: str) -> None:
    with open(path, "a") as f:  # noqa: PTH123 - kept to the bare minimum on purpose
        f.write(line + "\n")


append(f"start {time.time()} {os.getpid()} {os.environ.get('DEVHEAL_LAUNCHER_ADDR', '-')}")


def on_sigterm(*_: object) -> None:
    time.sleep(0.5)
    append(f"stop {time.time()} {os.getpid()} -")
    sys.exit(0)


signal.signal(signal.SIGTERM, on_sigterm)
gpus = PodSlowdown.from_env()
step = 0
while True:
    began = time.monotonic()
    time.sleep(0.05 * gpus.factor())  # the rank's own compute, before any collective
    step += 1
    report_step(time.monotonic() - began, step)
    if checkpoint_every and step % checkpoint_every == 0:
        report_checkpoint()
        append(f"checkpoint {time.time()} {os.getpid()} -")
    if mode.startswith("exit") and step >= 5:
        sys.exit(int(mode[4:]))
