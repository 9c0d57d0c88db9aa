"""Engine configuration: nested dicts, dotted keys and keyword arguments to flat strings."""

_LIST_SEPARATORS = {"plugin_path": ":"}


def _value_text(key, value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, set, frozenset)):
        sep = _LIST_SEPARATORS.get(key, ",")
        return sep.join(_value_text(key, v) for v in value)
    if isinstance(value, bytes):
        return value.decode()
    try:
        import os
        if isinstance(value, os.PathLike):
            return os.fspath(value)
    except TypeError:
        pass
    return str(value)


def _flatten(prefix, value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            k = str(k)
            # transports: {tcp: {lanes: 2}} means tcp.lanes, as in the YAML files.
            if not prefix and k == "transports" and isinstance(v, dict):
                _flatten("", v, out)
            else:
                _flatten(prefix + "." + k if prefix else k, v, out)
        return
    if value is None:
        return
    out[prefix] = _value_text(prefix, value)


def flatten_config(config=None, keys=None):
    """{'tcp': {'lanes': 2}}, {'tcp.lanes': 2} and tcp__lanes=2 all give {'tcp.lanes': '2'}.
    Keyword arguments override the mapping. None values are left out."""
    out = {}
    if config is not None:
        if not isinstance(config, dict):
            raise TypeError("config must be a dict (use Engine.from_file for a YAML path)")
        _flatten("", config, out)
    for k, v in (keys or {}).items():
        _flatten(k.replace("__", "."), v, out)
    return out
