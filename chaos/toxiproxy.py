"""A thin asynchronous Toxiproxy HTTP client with a timeout on every call.

The chaos suite drives faults from its event loop while clients run beside it,
so a slow or dead Toxiproxy must never block the loop nor hang a run: every
call is an `httpx.AsyncClient` request bounded by `timeout_s`, and a failure
raises `UnavailableError` naming the call. No global state: one client per server.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Self

import httpx

from controlplane.errors import InvalidInputError, NotFoundError, UnavailableError

Stream = str  # "upstream" (client -> server) or "downstream" (server -> client)
BOTH: tuple[Stream, ...] = ("upstream", "downstream")


class AsyncToxiproxy:
    def __init__(self, api_url: str, *, timeout_s: float = 3.0) -> None:
        base = api_url if "://" in api_url else f"http://{api_url}"
        self.api_url = base.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.api_url, timeout=timeout_s)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _request(
        self, what: str, method: str, path: str, body: object | None = None
    ) -> httpx.Response:
        try:
            response = await self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise UnavailableError(
                f"Toxiproxy at {self.api_url} did not answer to {what}: {exc!r}"
            ) from exc
        if response.status_code == 404:
            raise NotFoundError(f"Toxiproxy has no such proxy or toxic ({what})")
        if response.status_code >= 400:
            raise InvalidInputError(
                f"Toxiproxy refused to {what}: {response.status_code} {response.text.strip()}"
            )
        return response

    async def version(self) -> str:
        return (await self._request("report its version", "GET", "/version")).text.strip()

    async def create_proxy(self, name: str, listen: str, upstream: str) -> None:
        """Create the proxy, replacing one of that name (left by an earlier run)."""
        with contextlib.suppress(NotFoundError):
            await self._request(f"delete stale proxy {name}", "DELETE", f"/proxies/{name}")
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": True}
        await self._request(f"create proxy {name} on {listen}", "POST", "/proxies", body)

    async def delete_proxy(self, name: str) -> None:
        await self._request(f"delete proxy {name}", "DELETE", f"/proxies/{name}")

    async def set_enabled(self, name: str, enabled: bool) -> None:
        """Disabled: every connection is closed and new ones are refused."""
        what = f"{'enable' if enabled else 'disable'} {name}"
        await self._request(what, "POST", f"/proxies/{name}", {"enabled": enabled})

    async def add_toxic(
        self,
        proxy: str,
        kind: str,
        attributes: dict[str, int | float],
        *,
        streams: tuple[Stream, ...] = BOTH,
        toxicity: float = 1.0,
    ) -> list[str]:
        """Add a toxic of `kind` on each of `streams`; returns the toxics' names."""
        names = []
        for stream in streams:
            name = f"{kind}_{stream}"
            body = {
                "name": name,
                "type": kind,
                "stream": stream,
                "toxicity": toxicity,
                "attributes": attributes,
            }
            await self._request(f"add {kind} to {proxy}", "POST", f"/proxies/{proxy}/toxics", body)
            names.append(name)
        return names

    async def toxics(self, proxy: str) -> list[str]:
        got = await self._request(f"list toxics of {proxy}", "GET", f"/proxies/{proxy}/toxics")
        return [str(t["name"]) for t in got.json()]

    async def clear(self, proxy: str) -> None:
        """Remove every toxic of `proxy` and enable it."""
        for name in await self.toxics(proxy):
            with contextlib.suppress(NotFoundError):
                await self._request(
                    f"remove {name} of {proxy}", "DELETE", f"/proxies/{proxy}/toxics/{name}"
                )
        await self.set_enabled(proxy, True)

    async def cut(self, proxy: str, *, streams: tuple[Stream, ...] = BOTH) -> None:
        """Stop all data on `streams` without closing connections (a black hole):
        Toxiproxy's timeout toxic with timeout 0."""
        await self.add_toxic(proxy, "timeout", {"timeout": 0}, streams=streams)
