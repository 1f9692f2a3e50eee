"""Route tau2's loguru records into stdlib logging, once per process."""

import logging

_TAU2_LOGGER = logging.getLogger("tau2")
_routed = False


def _forward(message) -> None:
    record = message.record
    level = record["level"].no
    if _TAU2_LOGGER.isEnabledFor(level):
        _TAU2_LOGGER.log(level, "%s", record["message"])


def route_tau2_logs(level: int = logging.ERROR) -> None:
    """Send loguru (tau2's logger) to the ``tau2`` stdlib logger, quiet by default.

    tau2 logs every tool response at DEBUG and expected conditions (a gold action that errors, a missing
    ``.env`` file) at WARNING; at ERROR by default those stay out of the way. Lower the ``tau2`` logger's
    level to see them.
    """
    global _routed
    if _routed:
        return
    from loguru import logger

    logger.remove()
    logger.add(_forward, level=0, format="{message}")
    if _TAU2_LOGGER.level == logging.NOTSET:
        _TAU2_LOGGER.setLevel(level)
    _routed = True
