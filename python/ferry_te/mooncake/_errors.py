"""The error a Mooncake argument Ferry cannot serve raises inside ferry_te.mooncake."""


class SetupError(Exception):
    """A Mooncake argument Ferry cannot serve: .code (negative errno) and the message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
