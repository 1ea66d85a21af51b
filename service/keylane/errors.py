"""The keylane error hierarchy: one root, a ``retriable`` flag on every class.

Three families, by what the caller should do:

* retriable (``retriable = True``): try again later, e.g. a broker that is not reachable yet;
* permanent: the input or request is wrong; it goes to ``agent.errors`` or back to the user;
* fatal (``Fatal``): something keylane relies on is broken, and nothing about the input can
  fix it: a record Kafka refused crashes the worker (the supervisor restarts it from the last
  committed offset); a key's state blob that is corrupt or from a newer keylane quarantines
  that key: its inputs become ``poison_state`` dead letters until an operator acts, and the
  other keys go on (service/keylane/core/quarantine.py).

Messages of errors an operator must act on say what to do.
"""

from __future__ import annotations

from typing import ClassVar


class KeylaneError(Exception):
    """Root of every error keylane raises on purpose."""

    retriable: ClassVar[bool] = False


class Fatal(KeylaneError):
    """Root of the fatal family: the worker must stop rather than go on."""


class ConfigError(KeylaneError):
    """Configuration or command-line input is wrong; the message names the fix."""


class UserCodeFailed(ConfigError):
    """User code named on the command line raised while it loaded. ``traceback`` holds the
    frames of the user's code, which say where; the message says what was being loaded."""

    def __init__(self, message: str, traceback: str) -> None:
        super().__init__(message)
        self.traceback = traceback


class BrokerUnavailable(KeylaneError):
    """No Kafka broker answered at the configured bootstrap address."""

    retriable = True


class TopicDrift(KeylaneError):
    """A topic on the broker contradicts the catalog in a way keylane refuses to paper over."""
