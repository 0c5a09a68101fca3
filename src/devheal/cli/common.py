"""What the commands that talk to a cluster share: the connection options and one-line errors.

A person who typed a wrong path or context, or whose cluster is down, needs one line saying
what is wrong and what to do, not a traceback. Heavy modules are imported inside the
functions: ``devheal --help`` must not pay for an HTTP stack it does not use.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    from devheal.kube.errors import KubeError

Kubeconfig = Annotated[
    str | None,
    typer.Option(
        help="Kubeconfig path (default, as kubectl: $KUBECONFIG, then ~/.kube/config, then the pod's service account)."
    ),
]
Context = Annotated[str | None, typer.Option(help="The kubeconfig context to use (default: its current-context).")]

USAGE_ERROR = 2
"""Exit code: the command cannot work as invoked (bad option, bad kubeconfig)."""
FAILED = 1
"""Exit code: the cluster cannot be used (unreachable, refused, devheal's CRDs missing)."""


def fail(command: str, message: str, code: int = USAGE_ERROR) -> NoReturn:
    """Print ``devheal COMMAND: message`` as one line on stderr and exit with ``code``."""
    typer.echo(f"devheal {command}: {' '.join(message.split())}", err=True)
    raise typer.Exit(code)


def explain(exc: KubeError) -> tuple[str, int]:
    """A Kubernetes error as one line for a person, and the exit code it deserves."""
    from devheal.kube import errors
    from devheal.kube.crds import CRDsMissing
    from devheal.kube.kubeconfig import ConfigError

    if isinstance(exc, ConfigError):
        return str(exc), USAGE_ERROR
    if isinstance(exc, CRDsMissing):
        return str(exc), FAILED
    if isinstance(exc, errors.Unavailable) and not exc.status:
        return (
            f"cannot reach the Kubernetes API server ({exc}): check that the cluster is running "
            "and that --kubeconfig/--context name it",
            FAILED,
        )
    if exc.status == 401:
        return f"the API server refused the credentials ({exc}): renew them in the kubeconfig", FAILED
    if exc.status == 403:
        return f"not allowed ({exc}): grant the RBAC rules of deploy/ to this identity", FAILED
    return str(exc), FAILED


def preflight(
    command: str, kubeconfig: str | None, plurals: tuple[str, ...] | None = None, context: str | None = None
) -> None:
    """Before the loops start (and retry for ever): the configuration loads, the API server answers, and it
    serves devheal's resources; otherwise one line saying what to fix, and exit."""
    from devheal.kube import errors
    from devheal.kube.client import KubeClient
    from devheal.kube.crds import PLURALS, check_installed

    async def check() -> None:
        async with await KubeClient.connect(kubeconfig, context=context, max_connections=1) as kube:
            await check_installed(kube, plurals or PLURALS)

    try:
        asyncio.run(check())
    except errors.KubeError as exc:
        message, code = explain(exc)
        fail(command, message, code)
