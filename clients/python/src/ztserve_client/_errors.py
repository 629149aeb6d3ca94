"""Typed errors: one class per kind of failure a caller may want to handle differently."""


class ZtserveError(Exception):
    """Base of every error this client raises."""


class HTTPError(ZtserveError):
    """The server answered with a 4xx or 5xx status."""

    def __init__(self, status, code, message, url):
        self.status = status
        self.code = code
        self.message = message
        self.url = url
        super().__init__(f"{status} {code}: {message} ({url})")


class ClientError(HTTPError):
    """A 4xx answer not covered by a more specific class."""


class Unauthorized(ClientError):
    """401: no token, or one the server does not accept."""


class NotFound(ClientError):
    """404: no such model, object or component (or not visible to this token)."""


class RangeNotSatisfiable(ClientError):
    """416."""


class BrokenModel(ClientError):
    """422: the model's file breaks the format, or a component fails to decode or to match its digest."""


class ServerError(HTTPError):
    """A 5xx answer not covered by a more specific class."""


class Unavailable(ServerError):
    """503: not ready, the file changed, its source is down, or decoders are busy."""


class DigestMismatch(ZtserveError):
    """Bytes received do not match the digest the manifest declares for them."""


class ModelChanged(ZtserveError):
    """The model was replaced on the server while it loaded: some bytes came from another
    version of the file than the manifest. Nothing is returned; loading again reads the new one."""


class TransferError(ZtserveError):
    """The connection failed, or a body ended early, after every retry."""


class VersionGone(ModelChanged, ClientError):
    """410 (or a 404 of code) `version_gone`: the version asked for (pinned `id@version`, or a lineage's version
    no longer kept) is not served any more. A `ModelChanged` and a `ClientError` both."""

    def __init__(self, status, code, message, url):
        ClientError.__init__(self, status, code, message, url)


_BY_STATUS = {401: Unauthorized, 404: NotFound, 410: VersionGone, 416: RangeNotSatisfiable, 422: BrokenModel,
              503: Unavailable}


def error_for(status, code, message, url):
    if code == "version_gone" and 400 <= status < 500:
        return VersionGone(status, code, message, url)
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ClientError)
    return cls(status, code, message, url)
