"""WAN fault injection through `toxiproxy-python` (see `controlplane.ports.faults`).

The library keeps the server address in class-level globals (`APIConsumer.host`,
`.port`) and calls `requests` with no timeout. This wrapper serialises every call
behind one process-wide lock, binds the globals to this client's address for the
duration of the call, and routes the library's HTTP calls through a shim that
always passes a timeout. So two clients for two servers never cross, and a dead
server fails a call in `timeout_s` instead of hanging a chaos test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests
import toxiproxy.api
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists
from toxiproxy.proxy import Proxy

from controlplane.errors import ConfigError, InvalidInputError, NotFoundError, UnavailableError
from controlplane.ports.faults import ProxyInfo

T = TypeVar("T")
_LOCK = threading.RLock()


class _TimeoutRequests:
    """Stands in for the `requests` module inside toxiproxy.api; adds the bound timeout."""

    timeout_s: float = 5.0

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        return requests.get(url, timeout=self.timeout_s, **kwargs)

    def post(self, url: str, **kwargs: Any) -> requests.Response:
        return requests.post(url, timeout=self.timeout_s, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> requests.Response:
        return requests.delete(url, timeout=self.timeout_s, **kwargs)


_SHIM = _TimeoutRequests()
toxiproxy.api.requests = _SHIM  # why: see module docstring


class ToxiproxyClient:
    """A Toxiproxy server at `api_url`; every method is bounded by `timeout_s`."""

    def __init__(self, api_url: str = "http://127.0.0.1:8474", timeout_s: float = 5.0) -> None:
        parts = urlsplit(api_url if "//" in api_url else f"http://{api_url}")
        if not parts.hostname or not parts.port:
            raise ConfigError(f"Toxiproxy address {api_url!r} is not http://host:port")
        self.api_url = f"http://{parts.hostname}:{parts.port}"
        self._host, self._port, self.timeout_s = parts.hostname, parts.port, timeout_s
        self._server = Toxiproxy()

    @contextmanager
    def _bound(self) -> Iterator[None]:
        with _LOCK:
            saved = (
                toxiproxy.api.APIConsumer.host,
                toxiproxy.api.APIConsumer.port,
                _SHIM.timeout_s,
            )
            toxiproxy.api.APIConsumer.host = self._host
            toxiproxy.api.APIConsumer.port = self._port
            _SHIM.timeout_s = self.timeout_s
            try:
                yield
            finally:
                (
                    toxiproxy.api.APIConsumer.host,
                    toxiproxy.api.APIConsumer.port,
                    _SHIM.timeout_s,
                ) = saved

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        with self._bound():
            try:
                return fn()
            except requests.RequestException as exc:
                raise UnavailableError(
                    f"Toxiproxy at {self.api_url} did not answer to {what}: {exc}"
                ) from exc
            except NotFound as exc:
                raise NotFoundError(f"Toxiproxy has no such proxy or toxic ({what})") from exc
            except InvalidToxic as exc:
                raise InvalidInputError(f"Toxiproxy refused to {what}: {exc}") from exc

    def _proxy(self, name: str) -> Proxy:
        proxy = self._server.get_proxy(name)
        if proxy is None:
            raise NotFoundError(f"Toxiproxy at {self.api_url} has no proxy named {name!r}")
        return proxy

    def version(self) -> str:
        def get() -> str:
            response = toxiproxy.api.APIConsumer.get("/version")
            response.raise_for_status()
            return str(response.text).strip()

        return self._call("report its version", get)

    def create_proxy(self, name: str, listen: str, upstream: str) -> ProxyInfo:
        """Create the proxy, replacing one of the same name (a stale one from an earlier run)."""

        def create() -> ProxyInfo:
            try:
                try:
                    proxy = self._server.create(upstream=upstream, name=name, listen=listen)
                except ProxyExists:
                    self._server.destroy(self._proxy(name))
                    proxy = self._server.create(upstream=upstream, name=name, listen=listen)
            except KeyError:
                # The library reads the reply as a proxy without checking its status, so a
                # refusal (most often: the listen port is taken) surfaces as a KeyError.
                raise InvalidInputError(
                    f"Toxiproxy at {self.api_url} refused to create proxy {name} listening on "
                    f"{listen}; is that port already taken by another process?"
                ) from None
            return ProxyInfo(proxy.name, proxy.listen, proxy.upstream, bool(proxy.enabled))

        return self._call(f"create proxy {name}", create)

    def delete_proxy(self, name: str) -> None:
        self._call(f"delete proxy {name}", lambda: self._server.destroy(self._proxy(name)))

    def _add_both(
        self,
        proxy: str,
        toxic_type: str,
        attributes: dict[str, int],
        streams: tuple[str, ...] = ("upstream", "downstream"),
    ) -> None:
        def add() -> None:
            target = self._proxy(proxy)
            for stream in streams:
                target.add_toxic(
                    type=toxic_type,
                    stream=stream,
                    name=f"{toxic_type}_{stream}",
                    attributes=attributes,
                )

        self._call(f"add a {toxic_type} toxic to {proxy}", add)

    def add_latency(self, proxy: str, latency_ms: int, jitter_ms: int = 0) -> None:
        """Add `latency_ms` each way, so a round trip pays twice that."""
        self._add_both(proxy, "latency", {"latency": latency_ms, "jitter": jitter_ms})

    def add_bandwidth(self, proxy: str, rate_kib_s: int) -> None:
        self._add_both(proxy, "bandwidth", {"rate": rate_kib_s})

    def add_timeout(
        self,
        proxy: str,
        timeout_ms: int,
        streams: tuple[str, ...] = ("upstream", "downstream"),
    ) -> None:
        """Stop all data on `streams` and close the connection after `timeout_ms` (0: never
        close). Only "downstream": requests still arrive, their answers never come back
        (a one-way partition)."""
        self._add_both(proxy, "timeout", {"timeout": timeout_ms}, streams)

    def add_limit_data(self, proxy: str, limit_bytes: int, stream: str = "downstream") -> None:
        """Close the connection once `limit_bytes` have passed in `stream` (`downstream`:
        from the upstream server to the client), as a link that breaks mid-transfer."""

        def add() -> None:
            self._proxy(proxy).add_toxic(
                type="limit_data",
                stream=stream,
                name=f"limit_data_{stream}",
                attributes={"bytes": limit_bytes},
            )

        self._call(f"add a limit_data toxic to {proxy}", add)

    def remove_toxics(self, proxy: str) -> None:
        def remove() -> None:
            target = self._proxy(proxy)
            for name in target.toxics():
                target.destroy_toxic(name)

        self._call(f"remove toxics of {proxy}", remove)

    def disable(self, proxy: str) -> None:
        self._call(f"disable {proxy}", lambda: self._proxy(proxy).disable())

    def enable(self, proxy: str) -> None:
        self._call(f"enable {proxy}", lambda: self._proxy(proxy).enable())

    def reset(self) -> None:
        self._call("reset", self._server.reset)
