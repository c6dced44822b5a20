"""One error hierarchy for the whole service, translated to HTTP in ``api/errors.py``."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    status = 500
    code = "internal"

    def __init__(
        self,
        message: str,
        details: Any = None,
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers or {}
        if code is not None:
            self.code = code


class BadRequest(ServiceError):
    status = 400
    code = "bad_request"


class Unauthorized(ServiceError):
    status = 401
    code = "unauthorized"


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class Gone(ServiceError):
    status = 410
    code = "gone"


class PayloadTooLarge(ServiceError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status = 415
    code = "unsupported_media_type"


class Invalid(ServiceError):
    status = 422
    code = "invalid"


class Unavailable(ServiceError):
    status = 503
    code = "unavailable"


class Timeout(ServiceError):
    status = 504
    code = "timeout"
