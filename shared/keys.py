"""Owns the Redis key schema: every tokenferry key name and TTL is spelled here.

| key                          | type   | writer  | reader          | bound: TTL, size                      |
|------------------------------|--------|---------|-----------------|---------------------------------------|
| tf:queue:{model}:{lane}      | zset   | gateway | worker (arq)    | an entry per queued or running job,   |
|                              |        |         |                 | gone at its end; interactive: past    |
|                              |        |         |                 | max_queued_requests a 429 (withdrawn) |
| tf:queue:{model}:{lane}:health-check | string | worker | nobody   | arq's health record; 3,601 s        |
| tf:events:{request_id}       | stream | worker  | gateway         | EVENTS_TTL_S, re-armed at the end;    |
|                              |        |         |                 | EVENTS_MAXLEN entries                 |
| tf:worker:{worker_id}        | string | worker  | gateway         | WORKER_TTL_S, refreshed by heartbeat  |
| tf:workers                   | set    | worker  | gateway         | live workers; stale ones pruned by    |
|                              |        |         |                 | readers                               |
| tf:models:known              | hash   | worker  | gateway         | model -> last seen (s); KNOWN_TTL_S;  |
|                              |        |         |                 | a field per model name operators run  |
| tf:run:{request_id}          | hash   | worker  | worker, gateway | a running job's owner; RUN_TTL_S      |
| tf:running:{model}           | set    | worker  | worker (reaper) | members removed with their tf:run     |
| tf:sweep:{model}             | string | worker  | worker (reaper) | the reap interval: whose turn it is   |
| tf:cancelled:{request_id}    | string | gateway | worker          | CANCELLED_TTL_S                       |
| tf:wake:{model}              | pubsub | gateway | worker          | (channel: a job was enqueued)         |
| tf:aborts                    | pubsub | gateway | worker          | (channel: an abort was added)         |
| tf:request:{request_id}      | string | gateway | gateway         | EVENTS_RUNNING_TTL_S (how to render a |
|                              |        |         |                 | resume)                               |
| tf:reply:{request_id}        | list   | worker  | gateway (BLPOP) | REPLY_TTL_S; one reply                |
| tf:key:{sha256 hex}          | hash   | keys    | gateway         | kept (revoked: a flag); one API key   |
|                              |        |         |                 | an admin created                      |
| tf:keys                      | hash   | keys    | gateway, keys   | kept: key id -> hash, one per key     |
| tf:rate:{key_id}:{resource}  | hash   | gateway | gateway         | RATE_WINDOW_S (idle bucket is full)   |
| tf:owner:{kind}:{id}         | string | gateway | gateway         | the resource's lifetime, set by it    |
| tf:file:{file_id}            | hash   | gateway | gateway         | retention (``expires_at``)            |
| tf:file:{file_id}:content    | string | gateway | gateway         | as its tf:file; max_file_bytes        |
| tf:files:{tenant}            | zset   | gateway | gateway         | retention; stale members pruned       |
| tf:file-bytes:{tenant}       | hash   | gateway | gateway         | retention; file id -> size (quota)    |
| tf:streams:{tenant}          | zset   | gateway | gateway         | open streams scored by lapse time;    |
|                              |        |         |                 | max_streams_per_tenant members        |
| tf:batch:{batch_id}          | hash   | gateway | gateway, runner | window + retention; retention at end  |
| tf:batch:{batch_id}:{part}   | *      | runner  | runner          | as its tf:batch (done/inflight/...);  |
|                              |        |         |                 | a member per line of its file         |
| tf:batches:{tenant}          | zset   | gateway | gateway         | retention; stale members pruned       |
| tf:active:{kind}             | set    | gateway | runner          | members removed when work ends, or    |
|                              |        |         |                 | when the runner finds it expired      |
| tf:lease:{kind}:{id}         | string | runner  | runner          | RUNNER_LEASE_S, renewed while held    |
| tf:failures:{kind}:{id}      | string | runner  | runner          | RUNNER_FAILURES_TTL_S; gone at success |
| tf:metrics:queue-depth-lease | string | gateway | gateway         | QUEUE_DEPTH_LEASE_S (gateway/ops/     |
|                              |        |         |                 | queue_depth.py), renewed at scrapes   |
| tf:response:{response_id}    | hash   | gateway | gateway, runner | window + retention; retention at end  |
|                              |        |         |                 | (foreground: retention); holds the    |
|                              |        |         |                 | conversation for previous_response_id |
| arq:job:{job_id}             | string | both    | worker (arq)    | arq's expiry; deleted when it ends    |
| arq:in-progress:{job_id}     | string | worker  | worker, reaper  | job timeout + 10 s; deleted at end    |
| arq:retry:{job_id}           | string | worker  | worker (arq)    | arq's (88,400 s); deleted at its end  |
| arq:result:{job_id}          | string | nobody  | enqueue script  | never written (``keep_result=0``)     |
| arq:abort                    | zset   | gateway | worker          | ABORTS_MAX_AGE_S: the writer trims    |
|                              |        |         |                 | older entries; only live attempts get |
|                              |        |         |                 | one; arq removes those it cancelled   |

"runner" is ``gateway/background/runner.py`` (each gateway runs one); ``*``: set, hash or lists.

"keys" is ``shared/access/apikeys.py``, called by ``tokenferry keys`` and ``/admin/keys``;
"both": the gateway and the worker (a handover, a takeover).

The ``arq:`` keys are arq's own: arq names them, and they are spelled here (``ARQ_*``,
equal to ``arq.constants``, which a unit test checks) for the code that reproduces
arq's layout without arq: the enqueue script and the clean-up of dead attempts
(``shared/jobs/jobqueue.py``) and the claim script (``worker/queue/claims.py``).
arq itself is imported only by ``shared/jobs/arq_seam.py``. A job id is a request id,
or one of its attempts' (``attempt_job_id``).

Every key lives on one side (``SIDES``, which a unit test keeps complete, so a new key
must pick one): **group** keys are one model's traffic and live in its model group's
Redis (``--redis-groups``, ``shared/redis_groups.py``): the queues and arq's keys, event
streams, run records, cancellations, aborts, wake-ups, replies and the workers'
registry. **Home** keys belong to tenants or to the gateways and live in
``--redis-url``: API keys, rate limits, owners, files, batches, open-stream slots,
runner leases, stored responses and ``tf:request`` (a stream's view, which names the
model, so a resume on any gateway finds the request's group). Without groups both
sides are the same Redis. No script or pipeline may mix the sides.
"""

from __future__ import annotations

from enum import StrEnum

PREFIX = "tf:"

# A stream outlives its request long enough for a slow or reconnecting reader.
EVENTS_TTL_S = 600
# While a request runs, its stream must not expire under a long generation.
EVENTS_RUNNING_TTL_S = 3600
# Entries kept per stream: a request never produces more events than tokens plus two.
EVENTS_MAXLEN = 100_000
# Three missed heartbeats and the worker counts as gone, and its jobs are taken over.
WORKER_TTL_S = 4
# A model seen recently but with no live worker answers 503, not 404.
KNOWN_TTL_S = 86_400
# A run record outlives any request deadline; the reaper deletes it sooner.
RUN_TTL_S = 6 * 3600
# A cancellation must outlive any takeover race of the request it names.
CANCELLED_TTL_S = 3600
# A tokenize reply nobody popped (its gateway gave up) is garbage soon after.
REPLY_TTL_S = 60
# Rate limits are per minute: a bucket untouched this long has refilled, so it may vanish.
RATE_WINDOW_S = 60


class Side(StrEnum):
    """Which Redis a key lives in once models are grouped (``shared/redis_groups.py``)."""

    HOME = "home"  # --redis-url: tenants' records and the gateways' own
    GROUP = "group"  # the model group's Redis: one model's jobs, streams and workers


class Lane(StrEnum):
    """Separate queues so batch work never delays interactive requests."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


def queue(model: str, lane: Lane = Lane.INTERACTIVE) -> str:
    return f"{PREFIX}queue:{model}:{lane}"


def events(request_id: str) -> str:
    return f"{PREFIX}events:{request_id}"


def worker(worker_id: str) -> str:
    return f"{PREFIX}worker:{worker_id}"


def workers_index() -> str:
    return f"{PREFIX}workers"


def known_models() -> str:
    return f"{PREFIX}models:known"


def api_key(key_hash: str) -> str:
    """One API key's record, found by the SHA-256 hex of its secret."""
    return f"{PREFIX}key:{key_hash}"


def api_keys_index() -> str:
    return f"{PREFIX}keys"


def rate_bucket(key_id: str, resource: str) -> str:
    """The token bucket limiting one key's ``resource`` ("requests" or "tokens") per minute."""
    return f"{PREFIX}rate:{key_id}:{resource}"


def owner(kind: str, resource_id: str) -> str:
    """Which tenant created a resource (a request's stream, a file, a batch)."""
    return f"{PREFIX}owner:{kind}:{resource_id}"


def reply(request_id: str) -> str:
    """Where a worker answers a short request/reply job (tokenize, detokenize)."""
    return f"{PREFIX}reply:{request_id}"


def run(request_id: str) -> str:
    return f"{PREFIX}run:{request_id}"


def running(model: str) -> str:
    return f"{PREFIX}running:{model}"


def sweep_turn(model: str) -> str:
    """Held for one reap interval by the worker of ``model`` whose reaper sweeps in it."""
    return f"{PREFIX}sweep:{model}"


def cancelled(request_id: str) -> str:
    return f"{PREFIX}cancelled:{request_id}"


def wake(model: str) -> str:
    return f"{PREFIX}wake:{model}"


# Pub/sub channel on which every abort is announced: workers poll arq's abort set at once.
ABORTS_CHANNEL = f"{PREFIX}aborts"

# arq's keys (its ``arq.constants``): a job's payload, its claim, its try count, its
# result, and the set of job ids a client asked to abort.
ARQ_JOB_PREFIX = "arq:job:"
ARQ_IN_PROGRESS_PREFIX = "arq:in-progress:"
ARQ_RETRY_PREFIX = "arq:retry:"
ARQ_RESULT_PREFIX = "arq:result:"
ARQ_ABORTS = "arq:abort"
# An abort entry older than this is trimmed (arq's ``abort_job_max_age``): a running job is
# cancelled at its worker's next poll, announced at once, and the cancellation flag stops
# one that has not started yet.
ABORTS_MAX_AGE_S = 60


def request_view(request_id: str) -> str:
    return f"{PREFIX}request:{request_id}"


def request_id_of_job(arq_job_id: str) -> str:
    """The request an arq job id runs an attempt of (the inverse of ``attempt_job_id``)."""
    return arq_job_id.partition(ATTEMPT_SEPARATOR)[0]


# Between a request id and its attempt number in an attempt's arq job id.
ATTEMPT_SEPARATOR = "~"


def attempt_job_id(request_id: str, attempt: int) -> str:
    """The arq job id of one attempt: arq never reuses ids, so each takeover needs its own."""
    return request_id if attempt == 0 else f"{request_id}{ATTEMPT_SEPARATOR}{attempt}"


# Batches, files and background responses (gateway/batches/, gateway/responses_api/).
# A runner that stops renewing its lease (a dead gateway) loses its work this soon.
RUNNER_LEASE_S = 10
# How long a runner remembers an item's failures in a row (its driver raising).
RUNNER_FAILURES_TTL_S = 3600


def file(file_id: str) -> str:
    return f"{PREFIX}file:{file_id}"


def file_content(file_id: str) -> str:
    return f"{PREFIX}file:{file_id}:content"


def files_index(tenant: str) -> str:
    return f"{PREFIX}files:{tenant}"


def files_usage(tenant: str) -> str:
    """The sizes of a tenant's stored files (file id -> bytes), beside its index, for its quota."""
    return f"{PREFIX}file-bytes:{tenant}"


def open_streams(tenant: str) -> str:
    """A tenant's open SSE streams (its quota), each scored by the time it lapses if never closed."""
    return f"{PREFIX}streams:{tenant}"


def batch(batch_id: str) -> str:
    return f"{PREFIX}batch:{batch_id}"


def batch_part(batch_id: str, part: str) -> str:
    """One of a batch's working sets: ``done``, ``inflight``, ``output`` or ``errors``."""
    return f"{PREFIX}batch:{batch_id}:{part}"


def batches_index(tenant: str) -> str:
    return f"{PREFIX}batches:{tenant}"


def active(kind: str) -> str:
    """Ids of unfinished work of ``kind`` ("batch", "response") that some runner must drive."""
    return f"{PREFIX}active:{kind}"


def runner_lease(kind: str, resource_id: str) -> str:
    return f"{PREFIX}lease:{kind}:{resource_id}"


def queue_depth_lease() -> str:
    """Held by the one gateway that exports ``tokenferry_queue_depth`` (its token as the value)."""
    return f"{PREFIX}metrics:queue-depth-lease"


def runner_failures(kind: str, resource_id: str) -> str:
    """How many times in a row the runners' drivers of one item raised."""
    return f"{PREFIX}failures:{kind}:{resource_id}"


def response(response_id: str) -> str:
    return f"{PREFIX}response:{response_id}"


_GROUP_KEYS = (
    "queue", "events", "worker", "workers_index", "known_models", "reply", "run", "running",
    "sweep_turn", "cancelled", "wake", "ABORTS_CHANNEL", "ARQ_JOB_PREFIX", "ARQ_IN_PROGRESS_PREFIX",
    "ARQ_RETRY_PREFIX", "ARQ_RESULT_PREFIX", "ARQ_ABORTS",
)  # fmt: skip
_HOME_KEYS = (
    "api_key", "api_keys_index", "rate_bucket", "owner", "request_view", "file", "file_content",
    "files_index", "files_usage", "open_streams", "batch", "batch_part", "batches_index", "active",
    "runner_lease", "queue_depth_lease", "runner_failures", "response",
)  # fmt: skip
# Each key function or key constant of this module, by name, and the side it lives on.
SIDES: dict[str, Side] = {name: Side.GROUP for name in _GROUP_KEYS} | {name: Side.HOME for name in _HOME_KEYS}
