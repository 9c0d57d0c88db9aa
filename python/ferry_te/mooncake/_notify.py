"""TransferNotify and its bytes on the wire: a Ferry notification (ferry_send_notification)
whose payload carries Mooncake's (name, msg) pair. A notification another Ferry program sent
without this framing reads as TransferNotify(sender segment name, message)."""

import struct

# b"MCN1", then the name's length (u32 little endian), the name, the message (UTF-8 both).
_MAGIC = b"MCN1"
_HEAD = struct.Struct("<4sI")


class TransferNotify:
    """Mooncake's TransferNotify: name and msg, both str, read-write."""

    __slots__ = ("name", "msg")

    def __init__(self, name="", msg=""):
        self.name = name
        self.msg = msg

    def __eq__(self, other):
        return (isinstance(other, TransferNotify) and self.name == other.name
                and self.msg == other.msg)

    def __hash__(self):
        return hash((self.name, self.msg))

    def __repr__(self):
        return "TransferNotify(name=%r, msg=%r)" % (self.name, self.msg)


def _utf8(value, what):
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise TypeError("TransferNotify.%s must be str, not %s" % (what, type(value).__name__))
    return value.encode("utf-8", "surrogateescape")


def encode_notification(notify):
    name = _utf8(notify.name, "name")
    return _HEAD.pack(_MAGIC, len(name)) + name + _utf8(notify.msg, "msg")


def decode_notification(sender, data):
    data = bytes(data)
    if data[:4] == _MAGIC and len(data) >= _HEAD.size:
        _, n = _HEAD.unpack_from(data)
        if _HEAD.size + n <= len(data):
            name = data[_HEAD.size:_HEAD.size + n]
            msg = data[_HEAD.size + n:]
            return TransferNotify(name.decode("utf-8", "surrogateescape"),
                                  msg.decode("utf-8", "surrogateescape"))
    return TransferNotify(sender, data.decode("utf-8", "surrogateescape"))
