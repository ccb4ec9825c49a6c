"""Owns the domain error hierarchy; each class carries its OpenAI type, code and HTTP status.

Errors are raised, never returned. A worker turns one into a ``failed`` event
(``ErrorInfo``); the gateway turns that back into the same class with
``error_from_info`` and one exception handler renders OpenAI's error JSON.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class ErrorInfo(BaseModel):
    """The wire form of an error, with exactly OpenAI's ``error`` object fields."""

    model_config = ConfigDict(frozen=True)

    message: str
    type: str
    param: str | None = None
    code: str | None = None
    status: int = 500


class TokenferryError(Exception):
    """Base of every error tokenferry answers with; the class decides status, type and code."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(
            message=self.message, type=self.type, param=self.param, code=self.code, status=self.status
        )


class InvalidRequest(TokenferryError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class Unauthorized(TokenferryError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDenied(TokenferryError):
    status = 403
    type = "invalid_request_error"
    code = "insufficient_permissions"


class NotFound(TokenferryError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class PayloadTooLarge(TokenferryError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class UnsupportedMediaType(TokenferryError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class Overloaded(TokenferryError):
    status = 429
    type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class RateLimited(Overloaded):
    """A key's own per-minute limit, as OpenAI reports it: ``type`` names the exhausted resource."""

    code = "rate_limit_exceeded"


class QuotaExceeded(Overloaded):
    """A tenant's standing quota (open streams, stored files) is used up until something ends."""

    code = "quota_exceeded"


class RequestRateLimited(RateLimited):
    type = "requests"


class TokenRateLimited(RateLimited):
    type = "tokens"


class WorkerFailed(TokenferryError):
    status = 500
    type = "server_error"
    code = "worker_failed"


class NoLiveWorker(TokenferryError):
    status = 503
    type = "service_unavailable_error"
    code = "no_live_worker"


class Unavailable(TokenferryError):
    status = 503
    type = "service_unavailable_error"
    code = "service_unavailable"


class Timeout(TokenferryError):
    status = 504
    type = "timeout_error"
    code = "timeout"


def _all_error_classes() -> list[type[TokenferryError]]:
    pending: list[type[TokenferryError]] = [TokenferryError]
    found: list[type[TokenferryError]] = []
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def error_from_info(info: ErrorInfo) -> TokenferryError:
    """Rebuild the most specific error class matching a wire ``ErrorInfo``."""
    for cls in _all_error_classes():
        if cls.status == info.status and cls.code == info.code and cls.type == info.type:
            return cls(info.message, param=info.param)
    error = TokenferryError(info.message, param=info.param)
    # Unknown combination from a newer worker: keep what it said rather than guess.
    error.status, error.type, error.code = info.status, info.type, info.code  # type: ignore[misc]
    return error
