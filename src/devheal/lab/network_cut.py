"""Cut one simulated node's network: drop every packet its processes send on this machine's loopback.

The lab's ranks share this machine's loopback, so a node's network is its user: the ranks of
node N run as their own user (``devheal.lab.rank_processes``), and an iptables owner match on
that user drops what they send (their gloo and rendezvous traffic, and the acknowledgements
of what they receive), as a dead NIC would. The launcher runs as root, so its own traffic (the
API server) passes, as a pod's control traffic would on a management network; so can the
node's traffic to given loopback ports (``allow_ports``: its launcher's step endpoint, which in
a pod never leaves the pod's own loopback). The launcher's probes of the rendezvous store share
the pod's network with its rank (``devheal launch --probe-store``): they leave from the node's own
loopback address (``node_address``, ``--probe-bind``), and the cut drops what is sent from it too.
Every rule carries a comment naming the lab, so ``restore_all`` finds them.

Needs root and iptables (Debian's ``iptables`` package); a missing one is a clear error.
"""

from __future__ import annotations

import shutil
import subprocess

COMMENT = "devheal-lab-cut"


class NetworkCutError(RuntimeError):
    """iptables is missing or refused a rule."""


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("iptables")
    if binary is None:
        raise NetworkCutError("iptables is not installed: apt-get install iptables (a network cut needs it)")
    done = subprocess.run([binary, "-w", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetworkCutError(f"iptables {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


NODE_USER_BASE = 20000
"""The lab's node N runs its ranks as user ``NODE_USER_BASE + N`` (``node_user``)."""


def node_user(node: str) -> int:
    """The user a simulated node's ranks run as (the number its name ends with, above ``NODE_USER_BASE``): one per
    node, so a cut follows the node, not the rank."""
    return NODE_USER_BASE + int(node.rsplit("-", 1)[-1])


def node_address(uid: int) -> str:
    """The loopback address the processes of the node whose user is ``uid`` send from, where they choose one (the
    launcher's store probes): 127.200.0.0/16 holds one per user."""
    return f"127.200.{(uid >> 8) & 255}.{uid & 255}"


def cut(uid: int, allow_ports: tuple[int, ...] = ()) -> None:
    """Drop what ``uid`` sends on loopback, and what is sent from its ``node_address``, except what ``uid`` sends to
    the TCP ports in ``allow_ports``."""
    tag = ["-m", "comment", "--comment", f"{COMMENT}-{uid}"]
    owner = ["-o", "lo", "-m", "owner", "--uid-owner", str(uid)]
    _iptables("-I", "OUTPUT", *owner, *tag, "-j", "DROP")
    _iptables("-I", "OUTPUT", "-o", "lo", "-s", node_address(uid), *tag, "-j", "DROP")
    for port in allow_ports:  # inserted above the drop
        _iptables("-I", "OUTPUT", *owner, "-p", "tcp", "--dport", str(port), *tag, "-j", "ACCEPT")


def restore(uid: int) -> None:
    """Remove ``uid``'s cut (nothing when there is none)."""
    _remove(f"{COMMENT}-{uid}")


def restore_all() -> None:
    """Remove every cut the lab made (after a crash, too)."""
    if shutil.which("iptables") is not None:
        _remove(COMMENT)


def _remove(prefix: str) -> None:
    listing = _iptables("-S", "OUTPUT").stdout.splitlines()
    for line in listing:
        parts = line.split()
        if parts[:2] != ["-A", "OUTPUT"]:
            continue
        if any(p.strip('"').startswith(prefix) for p in parts):
            _iptables("-D", "OUTPUT", *[p.strip('"') for p in parts[2:]], check=False)
