"""The native YAML form, flattened to the same dotted keys an mm2.properties file has.

Shape (see configs/mm2.yaml)::

    clusters:                 # alias -> client settings; defines the cluster list
      A:
        bootstrap.servers: 127.0.0.1:19092
        consumer: {fetch.min.bytes: 1}     # also producer:, admin:
    replication.factor: 1     # global MM2 keys
    A->B:                     # flow keys, as A->B.<key> in mm2.properties
      enabled: true
      topics: [orders, "payments\\..*"]
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from mm2py.config.errors import ConfigError

_ROLES = ("consumer", "producer", "admin")


class _DuplicateKeyError(Exception):
    def __init__(self, key: object, line: int) -> None:
        self.key = key
        self.line = line


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, str | int | float | bool) and key in seen:
            raise _DuplicateKeyError(key, key_node.start_mark.line + 1)
        if isinstance(key, str | int | float | bool):
            seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def parse_yaml(
    text: str, path: Path, is_global_key: Callable[[str], str | None]
) -> dict[str, object]:
    """Parse the YAML form into flat MM2 keys (``A.bootstrap.servers``, ``A->B.topics``).

    ``is_global_key(key)`` returns None for a known top-level key, else an error message
    (with a "did you mean"). Values stay native (bool, int, list) for typed parsing later.
    """
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except _DuplicateKeyError as exc:
        raise ConfigError(path, f"line {exc.line}", f"key {exc.key!r} appears twice") from None
    except yaml.MarkedYAMLError as exc:
        # Only the problem and position: yaml's own message quotes the line, maybe a secret.
        mark = exc.problem_mark
        where = f"line {mark.line + 1}" if mark else None
        column = f" (column {mark.column + 1})" if mark else ""
        raise ConfigError(path, where, f"invalid YAML: {exc.problem}{column}") from None
    except yaml.YAMLError:
        raise ConfigError(path, None, "invalid YAML") from None
    if not isinstance(data, dict):
        found = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(path, None, f"expected a mapping of MM2 keys at the top, found {found}")

    flat: dict[str, object] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(path, str(key), "keys must be strings")
        if key == "clusters":
            flat["clusters"] = _clusters(value, path, flat)
        elif "->" in key:
            for sub, sub_value in _mapping(value, key, path, "flow settings").items():
                flat[f"{key}.{sub}"] = _value(sub_value, f"{key}.{sub}", path)
        else:
            problem = is_global_key(key)
            if problem:
                raise ConfigError(path, key, problem)
            flat[key] = _value(value, key, path)
    return flat


def _clusters(value: object, path: Path, flat: dict[str, object]) -> list[str]:
    clusters = _mapping(value, "clusters", path, "cluster aliases")
    for alias, settings in clusters.items():
        for key, item in _mapping(settings, f"{alias}", path, "client settings").items():
            if key in _ROLES:
                for role_key, role_value in _mapping(item, f"{alias}.{key}", path, key).items():
                    name = f"{alias}.{key}.{role_key}"
                    flat[name] = _value(role_value, name, path)
            else:
                flat[f"{alias}.{key}"] = _value(item, f"{alias}.{key}", path)
    return list(clusters)


def _mapping(value: object, key: str, path: Path, what: str) -> dict[str, object]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(path, key, f"expected a mapping of {what}")
    return value


def _value(value: object, key: str, path: Path) -> object:
    if value is None:
        return ""
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return value
    raise ConfigError(path, key, "expected a value or a list of values, not a nested mapping")
