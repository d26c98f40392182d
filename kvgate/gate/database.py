"""The example database a gate names: a directory, or a Redis server (the ``redis`` extra)."""

from __future__ import annotations

from kvgate.outputs import OutputError, check_directory

from .errors import UsageError


def open_database(spec: str):
    """``DIR`` -> a directory database (made if missing; it must be writable, or failures are
    never saved); ``redis://HOST:PORT[/DB]`` -> a Redis one. ``UsageError`` (one line) when it
    cannot be opened."""
    if spec.startswith(("redis://", "rediss://", "unix://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError:
            raise UsageError(
                f"--database {spec}: needs the redis client (pip install 'kvgate[redis]')"
            ) from None
        client = redis.Redis.from_url(spec, socket_connect_timeout=5)
        try:
            client.ping()
        except Exception as exc:  # connection refused, auth, ...
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"--database {spec}: cannot reach it: {text}") from None
        return RedisExampleDatabase(client)
    from hypothesis.database import DirectoryBasedExampleDatabase

    try:
        check_directory("--database", spec)
    except OutputError as exc:
        raise UsageError(str(exc)) from None
    return DirectoryBasedExampleDatabase(spec)
