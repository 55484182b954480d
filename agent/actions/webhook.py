"""Webhook actions: POST the decision as JSON; a 2xx answer is success.

Redirects are not followed (a 3xx is a failure: a robot's endpoint does not move), and
proxy settings from the environment are ignored (the targets are on the plant network).
``timeout_s`` bounds the connect and each read, as a socket timeout.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from typing import IO, Any

from agent.actions.config import WebhookAction
from agent.actions.errors import ActionFailed, ActionTimeout
from agent.actions.event import ActionEvent
from agent.kernel.errors import ConfigError

_MAX_BODY = 64 * 1024  # read (and discard) at most this much of an answer


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


class WebhookSender:
    """Delivers events for one webhook action.

    Raises:
        ConfigError: ``token_env`` names a variable or credential that is not set.
    """

    def __init__(self, action: WebhookAction) -> None:
        self.action = action
        self.name = action.name
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "edgefleet-agent",
            **action.headers,
        }
        if action.token_env:
            token = action.token()
            if token is None:
                raise ConfigError(
                    "",
                    f"actions.{action.name}.token_env",
                    f"{action.token_env} is not set in the environment or $CREDENTIALS_DIRECTORY",
                )
            headers["Authorization"] = f"Bearer {token}"
        self._headers = headers
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())

    def send(self, event: ActionEvent) -> None:
        """POST ``event``.

        Raises:
            ActionFailed: a non-2xx answer, or the connection failed.
            ActionTimeout: no connection or answer within ``timeout_s``.
        """
        a = self.action
        request = urllib.request.Request(  # noqa: S310 - the url is checked to be http(s)
            a.url, data=event.payload(), headers=self._headers, method="POST"
        )
        try:
            with self._opener.open(request, timeout=a.timeout_s) as response:
                status = int(response.status)
                response.read(_MAX_BODY)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise ActionFailed(a.name, f"{a.url} answered HTTP {exc.code}") from exc
        except TimeoutError as exc:
            raise ActionTimeout(a.name, f"{a.url} did not answer within {a.timeout_s:g} s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise ActionTimeout(
                    a.name, f"{a.url}: no connection within {a.timeout_s:g} s"
                ) from exc
            raise ActionFailed(a.name, f"{a.url}: {exc.reason}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise ActionFailed(a.name, f"{a.url}: {exc!r}") from exc
        if not 200 <= status < 300:
            raise ActionFailed(a.name, f"{a.url} answered HTTP {status}")
