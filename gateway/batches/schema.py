"""Owns the OpenAI shapes of the Files and Batch APIs: file objects, batch objects, JSONL lines.

Field names, types and status values follow the official SDK's types
(``openai/types/file_object.py``, ``batch.py``, ``batch_request_counts.py``,
``batch_error.py``) and OpenAI's documented batch input and output line formats.
Request models ignore unknown fields, like every OpenAI request model here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FilePurpose = Literal["batch", "batch_output"]
BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions"]
TERMINAL_BATCH_STATUSES: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class BatchCreateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input_file_id: str = Field(description="A file uploaded with purpose=batch.")
    endpoint: BatchEndpoint = Field(description="The endpoint every line of the file calls.")
    completion_window: Literal["24h"] = Field(description="How long the batch may run before it expires.")
    metadata: dict[str, str] | None = Field(None, description="Up to 16 string pairs kept with the batch.")


class BatchRequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchError(BaseModel):
    code: str | None = None
    message: str | None = None
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts
    metadata: dict[str, str] | None = None


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


# JSONL lines


class BatchInputLine(BaseModel):
    """One line of a batch input file; ``body`` is validated against ``url``'s request model."""

    model_config = ConfigDict(extra="forbid")

    custom_id: str = Field(min_length=1, max_length=512)
    method: Literal["POST"]
    url: BatchEndpoint
    body: dict[str, Any]


class LineResponse(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class LineError(BaseModel):
    code: str
    message: str


class BatchOutputLine(BaseModel):
    id: str
    custom_id: str
    response: LineResponse | None
    error: LineError | None
