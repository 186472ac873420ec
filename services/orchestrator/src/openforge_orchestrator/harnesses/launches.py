"""Builds each attempt's harness launch from the adapters and the local install manifests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from openforge_core.errors import FailedPrecondition, InvalidArgument
from openforge_orchestrator.domain.manifest import image_tag
from openforge_orchestrator.domain.rollouts import HARNESSES, Rollout
from openforge_orchestrator.domain.sandbox import HarnessLaunch
from openforge_orchestrator.domain.tasks import Task
from openforge_orchestrator.harnesses import adapter
from openforge_orchestrator.harnesses.base import HarnessNotInstalled, Installed, LaunchContext
from openforge_orchestrator.harnesses.browser import browser_settings
from openforge_orchestrator.harnesses.command import InvalidCommand

#: Harnesses that layer a settings file (``harness.config_files``) over their defaults.
CONFIG_FILE_HARNESSES: tuple[str, ...] = ("mini-swe-agent", "browser")


class LaunchFactory:
    """A :class:`~openforge_orchestrator.domain.execution.LaunchBuilder`.

    Args:
        install_dir: Where ``openforge harness install`` put the harnesses; None when they are on
            the sandbox image's PATH (Kubernetes).
        default_command: The ``command`` harness's template when a rollout gives none.
        images: Harness name → image (Kubernetes); its tag is the launch's version.
        config_files: Harness name → settings file layered over its defaults (read once, here;
            its text goes into each sandbox).

    Raises:
        ValueError: A settings file for a harness that takes none
            (:data:`CONFIG_FILE_HARNESSES`), a file that does not exist, or browser settings
            that do not parse (:func:`~openforge_orchestrator.harnesses.browser.browser_settings`).
    """

    def __init__(
        self,
        install_dir: Path | None,
        default_command: tuple[str, ...] = (),
        images: dict[str, str] | None = None,
        config_files: dict[str, str] | None = None,
    ) -> None:
        self._install_dir = install_dir
        self._default_command = default_command
        self._images = images or {}
        self._config_texts: dict[str, str] = {}
        for name, file in (config_files or {}).items():
            if name not in CONFIG_FILE_HARNESSES:
                known = ", ".join(CONFIG_FILE_HARNESSES)
                raise ValueError(f"harness.config_files: {name!r} takes no settings file (only {known})")
            path = Path(file)
            if not path.is_file():
                raise ValueError(f"harness.config_files: {name}: {file} is not a file")
            self._config_texts[name] = path.read_text(encoding="utf-8")
            if name == "browser":
                browser_settings(self._config_texts[name])  # refused at start, not per rollout

    def check_installed(self, harness: str) -> None:
        """Refuses a submission whose harness is not installed here (local sandboxes only).

        Checked when rollouts are submitted, so a missing install fails the request once instead
        of failing every rollout of it. Names that are not harnesses are left to the request's
        own validation (INVALID_ARGUMENT); ``command`` needs no install.

        Raises:
            FailedPrecondition: reason ``HARNESS_NOT_INSTALLED``, with the install command.
        """
        if harness in HARNESSES:
            self._installed(harness)

    def _installed(self, harness: str) -> Installed | None:
        """The local install of ``harness``; None for ``command`` and on Kubernetes (images).

        Raises:
            FailedPrecondition: reason ``HARNESS_NOT_INSTALLED``, with the install command.
        """
        if self._install_dir is None or harness == "command":
            return None
        try:
            return Installed.load(self._install_dir, harness)
        except HarnessNotInstalled as exc:
            raise FailedPrecondition(str(exc), reason="HARNESS_NOT_INSTALLED") from exc

    def __call__(self, rollout: Rollout, task: Task, base_url: str, api_key: str, timeout_s: float) -> HarnessLaunch:
        """The launch of one attempt.

        Raises:
            InvalidArgument: A bad ``command`` template.
            FailedPrecondition: The harness is not installed here.
        """
        installed = self._installed(rollout.harness)
        ctx = LaunchContext(
            instruction=task.instruction,
            base_url=base_url,
            api_key=api_key,
            model=rollout.model_name,
            workdir=task.environment.workdir,
            timeout_s=timeout_s,
            command=rollout.command or self._default_command,
            config_text=self._config_texts.get(rollout.harness, ""),
        )
        try:
            launch = adapter(rollout.harness).launch(ctx, installed)
        except InvalidCommand as exc:
            raise InvalidArgument.field("command", str(exc)) from exc
        image = self._images.get(rollout.harness, "")
        if image:  # the image's tag is the installed version (deploy/harness/<name> pins it)
            return replace(launch, image=image, version=launch.version or image_tag(image))
        return launch
