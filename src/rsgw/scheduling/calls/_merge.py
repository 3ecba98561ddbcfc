"""One answer from many workers' answers: statistics, repository indexes, SHM status.

Pure: protobuf messages in, one message out. The gateway fans a call out to its
workers and hands the replies here; what adds up and what does not is decided in
this one place (and documented in docs/api.md):
- statistics: per model and version, counts and durations add (every field of
  every `StatisticDuration`, per batch size for the batch statistics, per key for
  the response statistics), `last_inference` is the latest, memory usage is listed
  per worker rather than added (bytes on different GPUs are not one pool);
- repository index: one row per model and version, READY if any worker has it
  ready, else the state and reason of the first worker (in configured order) that
  lists it;
- shared memory status (system and CUDA): the regions every answering worker reports the same
  way; a region some worker lacks or describes differently is left out (it cannot
  be used through the gateway, since any worker may serve the next request).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.scheduling.calls._routing import READY_STATE, is_ready_state

if TYPE_CHECKING:
    from google.protobuf.message import Message

_DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
_BATCH_DURATIONS = ("compute_input", "compute_infer", "compute_output")
_RESPONSE_DURATIONS = (
    "compute_infer",
    "compute_output",
    "success",
    "fail",
    "empty_response",
    "cancel",
)


def _add_fields(into: Message, more: Message, names: tuple[str, ...]) -> None:
    """Add the durations `more` has into `into` (leaving absent ones absent)."""
    for name in names:
        if more.HasField(name):
            target = getattr(into, name)
            source = getattr(more, name)
            target.count += source.count
            target.ns += source.ns


def merge_statistics(answers: Sequence[pb.ModelStatisticsResponse]) -> pb.ModelStatisticsResponse:
    """The fleet's statistics: each model and version once, summed over the answers."""
    merged: dict[tuple[str, str], pb.ModelStatistics] = {}
    batches: dict[tuple[str, str, int], pb.InferBatchStatistics] = {}
    for answer in answers:
        for stats in answer.model_stats:
            key = (stats.name, stats.version)
            total = merged.get(key)
            if total is None:
                total = merged[key] = pb.ModelStatistics(name=stats.name, version=stats.version)
            total.last_inference = max(total.last_inference, stats.last_inference)
            total.inference_count += stats.inference_count
            total.execution_count += stats.execution_count
            if stats.HasField("inference_stats"):
                total.inference_stats.SetInParent()
                _add_fields(total.inference_stats, stats.inference_stats, _DURATIONS)
            for batch in stats.batch_stats:
                slot = batches.get((*key, batch.batch_size))
                if slot is None:
                    slot = total.batch_stats.add(batch_size=batch.batch_size)
                    batches[(*key, batch.batch_size)] = slot
                _add_fields(slot, batch, _BATCH_DURATIONS)
            total.memory_usage.extend(stats.memory_usage)
            for response_key, response in stats.response_stats.items():
                _add_fields(total.response_stats[response_key], response, _RESPONSE_DURATIONS)
    for total in merged.values():
        total.batch_stats.sort(key=lambda batch: batch.batch_size)
    return pb.ModelStatisticsResponse(model_stats=[merged[key] for key in sorted(merged)])


def merge_indexes(answers: Sequence[pb.RepositoryIndexResponse]) -> pb.RepositoryIndexResponse:
    """One row per model and version, in name order; `answers` in configured order."""
    rows: dict[tuple[str, str], pb.RepositoryIndexResponse.ModelIndex] = {}
    for answer in answers:
        for row in answer.models:
            key = (row.name, row.version)
            known = rows.get(key)
            if known is None or (is_ready_state(row.state) and not is_ready_state(known.state)):
                rows[key] = row
    merged = pb.RepositoryIndexResponse(models=[rows[key] for key in sorted(rows)])
    for row in merged.models:  # one spelling for the client, Triton's, whoever said it
        if row.state != READY_STATE and is_ready_state(row.state):
            row.state = READY_STATE
    return merged


ShmStatus = TypeVar(
    "ShmStatus", pb.SystemSharedMemoryStatusResponse, pb.CudaSharedMemoryStatusResponse
)


def merge_shm_status(answers: Sequence[ShmStatus]) -> ShmStatus:
    """The regions every answer (system or CUDA) reports identically; `answers` is not empty."""
    first, *others = answers
    merged = type(first)()
    for name, region in first.regions.items():
        if all(name in other.regions and other.regions[name] == region for other in others):
            merged.regions[name].CopyFrom(region)
    return merged
