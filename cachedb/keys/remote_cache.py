"""Keys of torch/_inductor/remote_cache.py: Redis keys of the remote caches.
"""

from __future__ import annotations

from .._errors import BadInputError


#: The ``c<version>`` suffix of Redis keys (``RedisRemoteCache.__init__``: ``version = 1``).
REDIS_KEY_VERSION = 1


def autotune_redis_key(cache_id: str, key: str, version: int = REDIS_KEY_VERSION) -> str:
    """Redis key of an entry of a Redis-backed remote cache: ``f"pt2:{cache_id}::{key}:c1"``.

    Mirrors torch/_inductor/remote_cache.py: RedisRemoteCache.__init__/_get_key (used by
    ``RemoteAutotuneCache``, ``RemoteBundledAutotuneCache``, ``RemoteFxGraphCache``, ...).
    torch first builds the template ``f"pt2:{cache_id}::{{key}}:c{version}"`` and then
    ``str.format``s it with ``key``, so braces in ``cache_id`` are format syntax (``"{{"``
    becomes ``"{"``, ``"{key}"`` becomes the key); this function does the same. Real ids
    (hex digests, ``"bundled-autotune-v1"``) hold no braces, which makes the result plain
    ``f"pt2:{cache_id}::{key}:c{version}"``.

    Args:
        cache_id: the id the cache was created with (:func:`autotune_remote_cache_id`,
            :data:`BUNDLED_AUTOTUNE_CACHE_ID`, ...).
        key: the entry's key within that cache (inserted verbatim).
        version: the ``c<version>`` suffix (1 in torch 2.13).

    Returns:
        The Redis key.

    Raises:
        TypeError: wrong argument types.
        BadInputError: ``cache_id`` holds braces that ``str.format`` rejects (torch raises
            ``KeyError``/``IndexError``/``ValueError`` there).
    """
    if not isinstance(cache_id, str) or not isinstance(key, str):
        raise TypeError("autotune_redis_key: cache_id and key must be str")
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError("autotune_redis_key: version must be an int")
    template = f"pt2:{cache_id}::{{key}}:c{version}"
    try:
        return template.format(key=key)
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise BadInputError("cache_id", f"braces that str.format rejects ({exc!r})") from exc
