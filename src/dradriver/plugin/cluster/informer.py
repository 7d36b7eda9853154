"""An informer: one resource listed once, then watched, into a local cache that handlers hear about.

As client-go's reflector and store promise: the first list is paginated (``limit``/``continue``) and the watch
starts from the list's resourceVersion with bookmarks on, so an idle cluster costs an open watch and nothing else.
A watch the server ends (its timeout, a dropped connection) is opened again from the last resourceVersion seen;
one that ends at once with nothing said is opened again from there too, after a backoff. A watch the server
refuses as too old (410 Gone) or that fails is followed, after a backoff, by a new list, whose difference with
the cache is delivered as events, so an object deleted while no watch ran is still reported deleted. Each watch
asks the server to end it after between ``watch_timeout`` and twice that (at random, as client-go does), so the
watches of many informers and replicas do not all end together.

Generic: the resource comes in as a :class:`ListWatch` (a path and a label selector, say), and objects stay JSON.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from dradriver.plugin.cluster.port import ClusterError, JsonObject, WatchExpiredError, WatchStream

log = logging.getLogger(__name__)

#: ``handler(old, new)``: added ``(None, new)``, changed ``(old, new)``, deleted ``(old, None)``.
Handler = Callable[[JsonObject | None, JsonObject | None], None]
#: An index function: the values an object is found under (a label's value, say); empty for none.
IndexFunction = Callable[[JsonObject], Iterable[str]]

PAGE_SIZE = 500
WATCH_TIMEOUT_SECONDS = 300
# A failing list or watch is retried after this, doubling up to the cap (client-go's reflector backs off too).
RETRY_INITIAL, RETRY_CAP = 0.2, 30.0


class _EndedAtOnce(ClusterError):
    """A watch ended at once with nothing said (a server refusing quietly): watched again from where it was, later."""


class ListWatch(Protocol):
    """One collection of the API server, as an informer reads it."""

    def list_page(self, *, limit: int, continue_token: str) -> tuple[list[JsonObject], str, str]:
        """One page: its items, the list's resourceVersion, and the token of the next page (empty: the last)."""
        ...

    def watch(self, *, resource_version: str, timeout_seconds: int) -> WatchStream:
        """Changes after ``resource_version``, bookmarks included; a too old one raises WatchExpiredError."""
        ...


def key_of(obj: JsonObject) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object: how the store keys objects."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


class Store:
    """Objects by key, thread-safe, with optional indices; readers get the stored dicts (never change them)."""

    def __init__(self, indices: dict[str, IndexFunction] | None = None) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, JsonObject] = {}
        self._index_functions = dict(indices or {})
        self._indices: dict[str, dict[str, set[str]]] = {name: {} for name in self._index_functions}
        self.changes = 0  # bumped by every change: a reader can tell whether anything changed since it looked

    def get(self, key: str) -> JsonObject | None:
        with self._lock:
            return self._items.get(key)

    def objects(self) -> list[JsonObject]:
        with self._lock:
            return list(self._items.values())

    def list_keys(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def by_index(self, index: str, value: str) -> list[JsonObject]:
        """The objects ``index`` files under ``value``."""
        with self._lock:
            return [self._items[k] for k in sorted(self._indices[index].get(value, ()))]

    def index_values(self, index: str) -> list[str]:
        """Every value ``index`` files some object under."""
        with self._lock:
            return list(self._indices[index])

    def put(self, obj: JsonObject) -> JsonObject | None:
        """Store ``obj``; the object it replaced, if any."""
        key = key_of(obj)
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                self._unindex(key, old)
            self._items[key] = obj
            self._index(key, obj)
            self.changes += 1
            return old

    def remove(self, obj: JsonObject) -> JsonObject | None:
        """Drop the object of ``obj``'s key; the one stored, if any."""
        key = key_of(obj)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._unindex(key, old)
                self.changes += 1
            return old

    def _index(self, key: str, obj: JsonObject) -> None:
        for name, function in self._index_functions.items():
            for value in function(obj):
                self._indices[name].setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: JsonObject) -> None:
        for name, function in self._index_functions.items():
            for value in function(obj):
                keys = self._indices[name].get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._indices[name][value]


def without_managed_fields(obj: JsonObject) -> JsonObject:
    """``obj`` without ``metadata.managedFields`` (server-side apply's bookkeeping, often half an object's size),
    as client-go's informers are commonly told to drop it; the object itself is left alone."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def metadata_only(obj: JsonObject) -> JsonObject:
    """``obj``'s kind and metadata (managedFields dropped) and nothing else: for a cache whose readers look at
    names and labels only, as client-go's metadata informers keep (a Node's status is most of its size)."""
    meta = without_managed_fields(obj).get("metadata") or {}
    kept: JsonObject = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
    return {**kept, "metadata": meta}


def _version(obj: JsonObject | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion", ""))


class Informer:
    """Keeps :attr:`store` equal to one collection and calls the handlers with each change: :meth:`run` in a
    thread; to end it, set its ``stop`` and call :meth:`close` (which ends a watch blocked in a read).
    :attr:`synced` is set once the first list is in the store."""

    def __init__(
        self,
        source: ListWatch,
        *,
        name: str,
        indices: dict[str, IndexFunction] | None = None,
        page_size: int = PAGE_SIZE,
        watch_timeout: int = WATCH_TIMEOUT_SECONDS,
        transform: Callable[[JsonObject], JsonObject] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``transform``: applied to every object before it is stored (to drop what no reader needs)."""
        self.source = source
        self._transform = transform or (lambda obj: obj)
        self.name = name
        self.store = Store(indices)
        self.synced = threading.Event()
        self.lists = 0  # lists made (the first and every relist): tests and logs tell a relist from a re-watch
        self._handlers: list[Handler] = []
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None
        self._stop = threading.Event()

    def add_handler(self, handler: Handler) -> None:
        """Call ``handler`` with every change from now on (add handlers before :meth:`run`)."""
        self._handlers.append(handler)

    def run(self, stop: threading.Event) -> None:
        """List, then watch, relisting when needed, until ``stop`` (or :meth:`stop`) is set."""
        self._stop = stop
        delay = RETRY_INITIAL
        version = ""
        while not stop.is_set():
            try:
                if not version:
                    version = self._relist()
                    self.synced.set()
                version = self._watch(version)
                delay = RETRY_INITIAL
            except WatchExpiredError as err:
                # Backed off too: a server whose history is always too short must not get a list per round trip.
                log.info("watch too old, listing again informer=%s retry_in=%.1fs error=%s", self.name, delay, err)
                version = ""
                stop.wait(delay)
                delay = min(delay * 2, RETRY_CAP)
            except _EndedAtOnce as err:
                log.warning(
                    "watch ended at once, watching again informer=%s retry_in=%.1fs error=%s", self.name, delay, err
                )
                stop.wait(delay)  # from the same resourceVersion: the cache is still right, no list needed
                delay = min(delay * 2, RETRY_CAP)
            except ClusterError as err:
                log.warning("list or watch failed informer=%s retry_in=%.1fs error=%s", self.name, delay, err)
                version = ""  # whatever was missed meanwhile, the next list finds
                stop.wait(delay)
                delay = min(delay * 2, RETRY_CAP)
        self.close()

    def close(self) -> None:
        """End the watch in progress (another thread's :meth:`run` then sees its ``stop``)."""
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def _relist(self) -> str:
        """List every page into the store, delivering the difference; the list's resourceVersion."""
        items: list[JsonObject] = []
        token, version = "", ""
        while True:
            page, page_version, token = self.source.list_page(limit=self._page_size, continue_token=token)
            items.extend(self._transform(obj) for obj in page)
            version = version or page_version  # every page is of the first page's snapshot
            if not token:
                break
        self.lists += 1
        self._replace(items)
        return version

    def _replace(self, items: list[JsonObject]) -> None:
        listed = {key_of(obj): obj for obj in items}
        for key in self.store.list_keys():
            if key not in listed:
                old = self.store.get(key)
                if old is not None:
                    self.store.remove(old)
                    self._deliver(old, None)
        for obj in listed.values():
            old = self.store.put(obj)
            if old is None or _version(old) != _version(obj):
                self._deliver(old, obj)

    def _watch(self, version: str) -> str:
        """Apply one watch's events; the resourceVersion to watch from next."""
        started = self._clock()
        timeout = random.randint(self._watch_timeout, 2 * self._watch_timeout)  # a spread, not a secret
        stream = self.source.watch(resource_version=version, timeout_seconds=timeout)
        with self._lock:
            self._stream = stream
        events = 0
        try:
            if self._stop.is_set():
                return version
            for event in stream:
                events += 1
                version = event.resource_version or version
                if event.type == "BOOKMARK":
                    continue
                obj = self._transform(event.object)
                if event.type == "DELETED":
                    old = self.store.remove(obj)
                    self._deliver(old or obj, None)
                else:
                    old = self.store.put(obj)
                    self._deliver(old, obj)
        finally:
            self.close()
        if not events and self._clock() - started < 1.0 and not self._stop.is_set():
            # Ended at once with nothing said (a server refusing quietly): not a loop of empty watches.
            raise _EndedAtOnce(f"the watch of {self.name} ended at once")
        return version

    def _deliver(self, old: JsonObject | None, new: JsonObject | None) -> None:
        for handler in self._handlers:
            try:
                handler(old, new)
            except Exception:  # a handler's fault must not stop the cache
                log.exception("informer handler failed informer=%s", self.name)
