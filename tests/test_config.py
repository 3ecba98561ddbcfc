"""The gateway configuration (rsgw.config._config, building rsgw.config._schema): keys,
defaults, env, files.

The scheduling knobs' own checks are tested one by one in tests/scheduling/test_knobs.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import pathlib
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

import rsgw
from rsgw.base._errors import ConfigError
from rsgw.config import _config
from rsgw.config._config import (
    ENV_VARIABLES,
    CompactionMode,
    FillMode,
    GatewayConfig,
    ModelOverride,
    RoutingPolicy,
    SchedulingConfig,
    SchedulingMode,
    TenantPolicy,
    TracingConfig,
    WorkBasis,
    env_name,
    find_config_file,
    load_config,
    parse_config,
)
from rsgw.config._endpoints import ConfiguredWorker, Pairing
from rsgw.config._tracing import OTEL_GENERAL, OTEL_SWITCHES, OTEL_VARIABLES

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
W = "REACTANT_GATEWAY_"
BASE: dict[str, Any] = {"endpoints": ["10.0.0.1:8080"]}


def parse(raw: Mapping[Any, Any] | None = None, /, **env: str) -> GatewayConfig:
    return parse_config({**BASE, **(raw or {})}, env)


def risks(cfg: GatewayConfig) -> list[str]:
    """`cfg.warnings` but the one every unauthenticated 0.0.0.0 listener gets."""
    return [w for w in cfg.warnings if not w.startswith("no authentication: ")]


def get(cfg: GatewayConfig, path: str) -> Any:
    value: Any = cfg
    for part in path.split("."):
        value = getattr(value, part)
    return value


def nested(path: str, value: object) -> dict[str, Any]:
    """`{"a": {"b": value}}` for path `a.b`."""
    *parents, leaf = path.split(".")
    raw: dict[str, Any] = {leaf: value}
    for parent in reversed(parents):
        raw = {parent: raw}
    return raw


def raises(raw: dict[str, Any], *fragments: str, **env: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse(raw, **env)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# -- defaults (docs/original.md §3.2 as amended by docs/product.md §3) -----------------------------

DEFAULTS: list[tuple[str, object]] = [
    ("listen.grpc", "0.0.0.0:8001"),
    ("listen.metrics", "0.0.0.0:8002"),
    ("listen.http", "0.0.0.0:8000"),
    ("metrics_endpoints", ()),
    ("worker_names", ()),
    ("worker_client.request_timeout_seconds", 60),
    ("worker_client.max_concurrent_streams", 64),
    ("worker_client.tls_ca_file", ""),
    ("worker_client.tls_cert_file", ""),
    ("worker_client.tls_key_file", ""),
    ("grpc.max_recv_msg_bytes", 536870912),
    ("grpc.max_send_msg_bytes", 536870912),
    ("grpc.max_concurrent_requests_per_worker", 64),
    ("grpc.max_queue_seconds", 1.0),
    ("logging.level", "info"),
    ("logging.format", "auto"),
    ("logging.access_log_sample_rate", 0.0),
    ("logging.access_log_max_per_second", 100),
    ("tls.cert_file", ""),
    ("tls.key_file", ""),
    ("tls.client_ca_file", ""),
    ("auth.tokens_file", ""),
    ("auth.identities", {}),
    ("auth.trusted_network", False),
    ("shm.max_regions_per_client", 64),
    ("shm.max_bytes_per_client", 0),
    ("shm.allow_remote_clients", False),
    ("shm.key_prefix", ""),
    ("server_metadata.name", ""),
    ("server_metadata.version", ""),
    ("shutdown.grace_seconds", 20.0),
    ("outlier_detection.stall_seconds", 0.5),
    ("outlier_detection.ping_timeout_seconds", 1.0),
    ("outlier_detection.ejection_seconds", 5.0),
    ("connections.max_connections", 10_000),
    ("connections.idle_seconds", 300.0),
    ("connections.header_seconds", 10.0),
    ("connections.max_header_list_bytes", 16384),
    ("connections.max_buffered_bytes", 64 * 1024 * 1024),
    ("connections.max_buffered_bytes_total", 256 * 1024 * 1024),
    ("connections.stream_window_bytes", 1024 * 1024),
    ("coordination.etcd_endpoints", ()),
    ("coordination.cluster", "default"),
    ("coordination.lease_ttl_seconds", 10),
    ("coordination.member", ""),
    ("connections.flood_budget", 1000),
    ("connections.max_concurrent_streams", 256),
    ("metrics.scrape_timeout_seconds", 1.0),
    ("discovery.models", ()),
    ("discovery.found_ttl_seconds", 300.0),
    ("discovery.miss_ttl_seconds", 10.0),
    ("discovery.lookups_per_second", 10),
    ("repository.models", ()),
    ("repository.weight_bytes", {}),
    ("repository.worker_budget_bytes", 0),
    ("repository.drain_seconds", 30.0),
    ("repository.load_timeout_seconds", 300.0),
    ("repository.default_weight_bytes", 0),
    ("repository.worker_budgets", {}),
    ("repository.min_residency_seconds", 10.0),
    ("repository.load_seconds", 0.0),
    ("repository.min_copies", {}),
    ("repository.max_copies", {}),
    ("repository.eviction", "value"),
    ("repository.demand_halflife_seconds", 60.0),
    ("scheduling.mode", SchedulingMode.ROUND_ROBIN),
    ("scheduling.work_basis", WorkBasis.COMPUTE),
    ("scheduling.rebalance_compute_seconds", 300.0),
    ("scheduling.first_rebalance_compute_seconds", 60.0),
    ("scheduling.max_worker_share", 0.8),
    ("scheduling.hysteresis", 0.0),
    ("scheduling.ema_halflife_compute_seconds", 0.0),
    ("scheduling.default_replicas", 1),
    ("scheduling.routing_fill_factor", 1.0),
    ("scheduling.routing_policy", RoutingPolicy.FILL_LEAST),
    ("scheduling.routing_fill_mode", FillMode.RUN),
    ("scheduling.forbid_memory_oversubscription", True),
    ("scheduling.compaction_mode", CompactionMode.EAGER),
    ("scheduling.compaction_interval", 1),
    ("scheduling.models", {}),
    ("tracing.endpoint", ""),
    ("tracing.protocol", "http/protobuf"),
    ("tracing.service_name", "rsgw"),
    ("tracing.sampler", "parentbased_always_on"),
    ("tracing.sampler_arg", 1.0),
    ("tracing.max_queue_size", 2048),
    ("tracing.max_export_batch_size", 512),
    ("tracing.schedule_delay_millis", 5000),
    ("tracing.export_timeout_millis", 30000),
    ("tenancy.header", ""),
    ("tenancy.priority_levels", 1),
    ("tenancy.default_priority", 0),
    ("tenancy.max_tenant_series", 100),
    ("tenancy.tenants", {}),
    ("tenancy.default", TenantPolicy()),
    ("startup_wait_seconds", 0.0),
    ("health_interval_seconds", 10.0),
    ("wedge_exit_rounds", 3),
    ("probe_timeout_seconds", 8.0),
]


@pytest.mark.parametrize(("path", "expected"), DEFAULTS)
def test_default(path: str, expected: object) -> None:
    value = get(parse(), path)
    assert value == expected
    assert type(value) is type(expected) or isinstance(expected, dict)


def test_defaults_of_a_hand_built_config_match_the_parsed_ones() -> None:
    assert GatewayConfig(endpoints=("10.0.0.1:8080",)) == parse()


def test_defaults_carry_no_overrides_and_only_the_unauthenticated_warning() -> None:
    cfg = parse()
    (warning,) = cfg.warnings
    assert warning == (
        "no authentication: any client that can reach 0.0.0.0:8001 (gRPC) or 0.0.0.0:8000 "
        "(REST) may run inference; calls that change the node (placement, scheduling, "
        "workers, model load and unload, memory compaction, log and trace settings) are "
        "taken from this host only. To require a token, set auth.tokens_file "
        "(docs/security.md); to serve this host only, listen on 127.0.0.1"
    )
    assert cfg.env_overrides == ()
    assert cfg.source is None


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "localhost"])
def test_no_unauthenticated_warning_on_loopback(host: str) -> None:
    listen = {"grpc": f"{host}:8001", "http": f"{host}:8000"}
    assert parse({"listen": listen}).warnings == ()
    assert parse({"listen": {"grpc": f"{host}:8001", "http": ""}}).warnings == ()


def test_the_unauthenticated_warning_names_only_the_open_listeners() -> None:
    (rest,) = parse({"listen": {"grpc": "127.0.0.1:8001"}}).warnings
    assert rest.startswith("no authentication: any client that can reach 0.0.0.0:8000 (REST) ")
    (grpc,) = parse({"listen": {"http": ""}}).warnings
    assert grpc.startswith("no authentication: any client that can reach 0.0.0.0:8001 (gRPC) ")


def test_the_unauthenticated_warning_under_trusted_network_says_who_may_change_the_node() -> None:
    (warning,) = parse({"auth": {"trusted_network": True}}).warnings
    assert "memory compaction, log and trace settings) are taken from anyone, because " in (warning)
    assert "auth.trusted_network is true. To require a token, set auth.tokens_file" in warning


def test_no_unauthenticated_warning_with_auth() -> None:
    assert parse({"auth": {"tokens_file": "/etc/rsgw/tokens.yml"}}).warnings == ()


def test_identities_need_a_client_ca() -> None:
    with pytest.raises(ConfigError, match=r"auth\.identities needs tls\.client_ca_file"):
        parse({"auth": {"identities": {"ops.example": ["operator"]}}})


@pytest.mark.parametrize(
    ("block", "fragment"),
    [
        ({"identities": {"ops": ["admin"]}}, "auth.identities.ops: unknown role 'admin'"),
        ({"identities": {"ops": []}}, "auth.identities.ops must be a non-empty list"),
        ({"identities": ["ops"]}, "auth.identities must map"),
        ({"tokens_file": 3}, "auth.tokens_file"),
        ({"trusted_network": "yes"}, "auth.trusted_network"),
    ],
)
def test_bad_auth_blocks_name_the_key(block: dict[str, object], fragment: str) -> None:
    tls = {"cert_file": "c.pem", "key_file": "k.pem", "client_ca_file": "ca.pem"}
    with pytest.raises(ConfigError) as caught:
        parse({"auth": block, "tls": tls})
    assert fragment in str(caught.value)


def test_shm_quotas_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"shm\.max_regions_per_client"):
        parse({"shm": {"max_regions_per_client": -1}})
    assert parse({"shm": {"max_bytes_per_client": 2**30}}).shm.max_bytes_per_client == 2**30


@pytest.mark.parametrize(
    ("block", "fragment"),
    [
        ({"models": "simple"}, "repository.models must be a list of model names, got 'simple'"),
        ({"weight_bytes": {"m": 0}}, "repository.weight_bytes.m must be positive, got 0"),
        ({"weight_bytes": ["m"]}, "repository.weight_bytes must be a mapping"),
        ({"worker_budget_bytes": -1}, "repository.worker_budget_bytes"),
        ({"drain_seconds": -1}, "repository.drain_seconds must be non-negative, got -1"),
        ({"load_timeout_seconds": 0}, "repository.load_timeout_seconds"),
        ({"worker_budgets": {"gpu0": -1}}, "repository.worker_budgets.gpu0"),
        ({"worker_budgets": ["gpu0"]}, "repository.worker_budgets must be a mapping of worker"),
        ({"min_copies": {"a": 1}}, "repository.min_copies.a: 'a' is not in repository.models"),
        ({"max_copies": {"a": 0}}, "repository.max_copies.a must be positive, got 0"),
        ({"eviction": "lfu"}, "repository.eviction must be value or lru, got 'lfu'"),
        ({"min_residency_seconds": -1}, "repository.min_residency_seconds must be non-negative"),
        (
            {"models": ["a"], "weight_bytes": {"a": 500}, "worker_budget_bytes": 400},
            "repository.weight_bytes.a is 500 for 'a': more than any worker's budget (400 bytes)",
        ),
        (
            {
                "models": ["a"],
                "default_weight_bytes": 500,
                "worker_budget_bytes": 300,
                "worker_budgets": {"w": 400},
            },
            "repository.default_weight_bytes is 500 for 'a': more than any worker's budget",
        ),
        (
            {"models": ["a"], "min_copies": {"a": 3}, "max_copies": {"a": 2}},
            "repository.min_copies.a is 3, more than its max_copies (2)",
        ),
    ],
)
def test_bad_repository_blocks_name_the_key(block: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"repository": block})
    assert fragment in str(caught.value)


def test_a_repository_block_parses() -> None:
    cfg = parse({"repository": {"models": ["a", "b"], "weight_bytes": {"a": 300}}})
    assert cfg.repository.models == ("a", "b")
    assert dict(cfg.repository.weight_bytes) == {"a": 300}
    assert hash(cfg) == hash(
        parse({"repository": {"models": ["a", "b"], "weight_bytes": {"a": 300}}})
    )


# -- tenancy (issue 52) -------------------------------------------------------------------------


def test_a_tenancy_block_parses_and_says_what_it_turns_on() -> None:
    assert not parse().tenancy.enabled
    cfg = parse(
        {
            "tenancy": {
                "header": " X-Tenant-Id ",
                "priority_levels": 3,
                "tenants": {"batch": {"weight": 0.5, "priority": 3, "rate": 10, "burst": 20}},
                "default": {"max_concurrent": 4},
            }
        }
    )
    tenancy = cfg.tenancy
    assert tenancy.enabled and tenancy.header == "x-tenant-id"
    assert tenancy.default_level == 2  # the middle of three
    batch = tenancy.policy("batch")
    assert (batch.weight, batch.priority, batch.rate, batch.burst) == (0.5, 3, 10.0, 20.0)
    assert batch.quota is not None and batch.quota.bucket_size == 20.0
    other = tenancy.policy("anyone")
    assert other.weight == 1.0 and other.quota is not None and other.quota.concurrency == 4
    assert parse_config(cfg.to_mapping()) == cfg and not parse_config(cfg.to_mapping()).notes
    blocks: list[dict[str, Any]] = [
        {"priority_levels": 2},
        {"header": "x-t"},
        {"tenants": {"a": {}}},
    ]
    for block in blocks:
        assert parse({"tenancy": block}).tenancy.enabled, block
    assert not parse({"tenancy": {"default": {"burst": 0}}}).tenancy.enabled


def test_tenancy_scalars_come_from_the_environment() -> None:
    cfg = parse(
        {"tenancy": {"priority_levels": 2}},
        REACTANT_GATEWAY_TENANCY_PRIORITY_LEVELS="4",
        REACTANT_GATEWAY_TENANCY_DEFAULT_PRIORITY="4",
        REACTANT_GATEWAY_TENANCY_HEADER="x-team",
        REACTANT_GATEWAY_TENANCY_MAX_TENANT_SERIES="7",
    )
    assert (cfg.tenancy.priority_levels, cfg.tenancy.default_level) == (4, 4)
    assert (cfg.tenancy.header, cfg.tenancy.max_tenant_series) == ("x-team", 7)


@pytest.mark.parametrize(
    ("block", "fragment"),
    [
        ({"priority_levels": 0}, "tenancy.priority_levels must be 1 to 16, got 0"),
        ({"priority_levels": 17}, "tenancy.priority_levels must be 1 to 16, got 17"),
        ({"priority_levels": "3"}, "config 'tenancy.priority_levels' must be an integer"),
        (
            {"priority_levels": 3, "default_priority": 4},
            "tenancy.default_priority must be 0 (the middle level) to "
            "tenancy.priority_levels (3), got 4",
        ),
        ({"max_tenant_series": 0}, "tenancy.max_tenant_series must be at least 1, got 0"),
        ({"header": "x tenant"}, "tenancy.header must be a header name"),
        ({"header": "Authorization"}, "tenancy.header cannot be 'authorization'"),
        ({"header": "grpc-timeout"}, "tenancy.header cannot be 'grpc-timeout'"),
        ({"header": "x-tenant-bin"}, "tenancy.header cannot be 'x-tenant-bin'"),
        ({"tenants": ["a"]}, "tenancy.tenants must be a mapping of tenant name to policy"),
        ({"tenants": {"a": 3}}, "tenancy.tenants.a must be a mapping of weight, priority"),
        ({"tenants": {"a": {"weight": 0}}}, "tenancy.tenants.a.weight must be positive, got 0"),
        ({"tenants": {"a": {"weight": "x"}}}, "config 'tenancy.tenants.a.weight' must be a"),
        ({"tenants": {"a": {"rate": -1}}}, "tenancy.tenants.a.rate must be non-negative, got -1"),
        ({"tenants": {"a": {"rate": 1, "burst": 0.5}}}, "tenancy.tenants.a.burst must be 0"),
        ({"tenants": {"a": {"burst": 5}}}, "tenancy.tenants.a.burst is 5 but"),
        ({"tenants": {"a": {"max_concurrent": -2}}}, "tenancy.tenants.a.max_concurrent must"),
        (
            {"tenants": {"a": {"priority": 2}}},
            "tenancy.tenants.a.priority is 2, past tenancy.priority_levels (1)",
        ),
        ({"tenants": {"a": {"priority": -1}}}, "tenancy.tenants.a.priority must be 0"),
        ({"tenants": {"": {}}}, "tenancy.tenants key '' names a tenant in 1 to 128"),
        ({"tenants": {"t\u00e9": {}}}, "is not printable ASCII"),
        ({"tenants": {"a" * 129: {}}}, "this value has 129 characters"),
        ({"tenants": {7: {}}}, "tenancy.tenants keys must be tenant names, got 7"),
        ({"default": {"rate": "fast"}}, "config 'tenancy.default.rate' must be a number"),
        ({"default": 5}, "tenancy.default must be a mapping of rate, burst, max_concurrent"),
    ],
)
def test_bad_tenancy_blocks_name_the_key(block: dict[str, object], fragment: str) -> None:
    raises({"tenancy": block}, fragment)


def test_tenancy_keys_it_does_not_take_are_noted() -> None:
    cfg = parse({"tenancy": {"tenants": {"a": {"rat": 5}}, "default": {"weight": 2}}})
    assert any("'tenancy.tenants.a.rat' ignored (did you mean" in note for note in cfg.notes)
    assert any("'tenancy.default.weight' ignored" in note for note in cfg.notes)
    with pytest.raises(ConfigError, match=r"tenancy\.default takes the quota"):
        dataclasses.replace(cfg.tenancy, default=TenantPolicy(weight=2.0))


def test_a_tenant_header_with_auth_on_is_a_warning() -> None:
    cfg = parse({"auth": {"tokens_file": "/t.yml"}, "tenancy": {"header": "x-tenant"}})
    assert any("tenancy.header (x-tenant) is not read" in w for w in cfg.warnings)
    assert not any("tenancy.header" in w for w in parse({"tenancy": {"header": "x"}}).warnings)


def test_every_yaml_key_has_a_default_test() -> None:
    dumped = parse().to_mapping()
    paths = {k for k in dumped if not isinstance(dumped[k], dict)} - {"endpoints"}
    paths |= {f"{b}.{k}" for b, block in dumped.items() if isinstance(block, dict) for k in block}
    assert paths <= {p for p, _ in DEFAULTS}


# -- tracing: gateway.yml's block and OpenTelemetry's own variables (issue 51) ----------------


def test_tracing_is_off_unless_an_exporter_is_configured() -> None:
    assert not parse().tracing.enabled
    on = parse({"tracing": {"endpoint": "http://collector:4318/v1/traces"}})
    assert on.tracing.enabled and on.tracing.endpoint == "http://collector:4318/v1/traces"
    # The SDK's default collector on localhost is not assumed: a sampler alone is not on.
    assert not parse(OTEL_TRACES_SAMPLER="always_on").tracing.enabled


def test_opentelemetry_variables_set_the_tracing_block_and_beat_the_file() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318/",
        "OTEL_SERVICE_NAME": "edge-gateway",
        "OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_BSP_EXPORT_TIMEOUT": "1000",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    }
    cfg = parse({"tracing": {"endpoint": "http://file:4318/v1/traces", "sampler_arg": 0.5}}, **env)
    assert cfg.tracing == TracingConfig(
        endpoint="http://otel:4318/v1/traces",  # the base URL, with v1/traces appended
        service_name="edge-gateway",
        sampler="parentbased_traceidratio",
        sampler_arg=0.01,
        max_queue_size=100,
        max_export_batch_size=10,
        schedule_delay_millis=200,
        export_timeout_millis=1000,
    )
    assert set(env) <= set(cfg.env_overrides)
    # The traces variable is the URL itself, and beats the general one.
    traces = "http://traces:4318/custom"
    cfg = parse(**env, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=traces)
    assert cfg.tracing.endpoint == traces
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in cfg.env_overrides
    assert parse_config(cfg.to_mapping()) == cfg  # the block round-trips through YAML


@pytest.mark.parametrize(
    "switch", [{"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_SDK_DISABLED": "TRUE"}]
)
def test_opentelemetry_switches_turn_tracing_off(switch: dict[str, str]) -> None:
    on = {"tracing": {"endpoint": "http://collector:4318/v1/traces"}}
    cfg = parse(on, OTEL_EXPORTER_OTLP_ENDPOINT="http://otel:4318", **switch)
    assert not cfg.tracing.enabled
    assert parse(on, OTEL_TRACES_EXPORTER="otlp", OTEL_SDK_DISABLED="false").tracing.enabled


@pytest.mark.parametrize(
    ("raw", "env", "fragment"),
    [
        ({"endpoint": "collector:4318"}, {}, "tracing.endpoint must be an http:// or https://"),
        ({"endpoint": 4318}, {}, "'tracing.endpoint' must be a string"),
        ({}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "tracing.protocol must be http/protobuf"),
        ({"protocol": "http/json"}, {}, "rsgw exports OTLP over HTTP only"),
        ({"sampler": "sometimes"}, {}, "tracing.sampler must be 'always_on', 'always_off'"),
        ({"sampler_arg": 2}, {}, "tracing.sampler_arg must be between 0 and 1, got 2"),
        (
            {},
            {"OTEL_TRACES_SAMPLER_ARG": "nan"},
            'OTEL_TRACES_SAMPLER_ARG has invalid number value "nan"',
        ),
        ({}, {"OTEL_BSP_MAX_QUEUE_SIZE": "lots"}, "OTEL_BSP_MAX_QUEUE_SIZE has invalid integer"),
        ({"max_queue_size": 0}, {}, "tracing.max_queue_size must be positive, got 0"),
        ({"max_queue_size": 10, "max_export_batch_size": 11}, {}, "must not be more than"),
        ({"service_name": " "}, {}, "tracing.service_name must be a non-empty name"),
        ({}, {"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER must be otlp or none"),
    ],
)
def test_bad_tracing_settings_name_the_key(
    raw: dict[str, object], env: dict[str, str], fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"tracing": raw}, **env)
    assert fragment in str(caught.value)


# -- derived values (docs/original.md §3.4) -----------------------------------------------------


def test_admission_cap_is_per_worker_times_workers() -> None:
    cfg = parse({"endpoints": ["a:1", "b:2", "c:3"]})
    assert cfg.max_concurrent_requests == 64 * 3
    uncapped = parse({"grpc": {"max_concurrent_requests_per_worker": 0}})
    assert uncapped.max_concurrent_requests == 0


def test_ema_halflife_resolves_to_rebalance_when_zero() -> None:
    assert parse().scheduling.resolved_ema_halflife == 300.0
    assert parse().scheduling.routing_meta_halflife == 300.0
    cfg = parse(
        {"scheduling": {"ema_halflife_compute_seconds": 45, "rebalance_compute_seconds": 9}}
    )
    assert cfg.scheduling.resolved_ema_halflife == 45.0
    assert cfg.scheduling.routing_meta_halflife == 45.0


def test_worker_label_pairs_names_with_endpoints_by_position() -> None:
    cfg = parse(
        {
            "endpoints": ["a:1", "b:2", "c:3"],
            "metrics_endpoints": ["a:9", "b:9"],
            "worker_names": ["w0", "w1"],
        }
    )
    assert [cfg.worker_label(u) for u in ("a:1", "b:2", "c:3", "a:9", "x:1")] == [
        "w0",
        "w1",
        "c:3",
        "w0",
        "x:1",
    ]


def test_pairing_walks_the_worker_lists_by_position() -> None:
    dns = "dns:///w.ns.svc:8001"
    cfg = GatewayConfig(  # by hand: gateway.yml's lists drop blank names
        endpoints=("a:1", "b:2", dns),
        metrics_endpoints=("a:9", "b:9", "dns:///w.ns.svc:9001", "x:9", "y:9"),
        worker_names=("w0", "", "", "wx"),
    )
    pairing = cfg.pairing()
    assert pairing.workers == (
        ConfiguredWorker("a:1", "a:9", "w0"),
        ConfiguredWorker("b:2", "b:9"),
        ConfiguredWorker(dns, "dns:///w.ns.svc:9001"),
    )
    assert [w.dns for w in pairing.workers] == [False, False, True]
    # Metrics endpoints past the endpoints pair with no worker; a name there still counts.
    assert pairing.unpaired == (ConfiguredWorker("", "x:9", "wx"), ConfiguredWorker("", "y:9"))
    assert [w.label for w in (*pairing.workers, *pairing.unpaired)] == [
        "w0",
        "b:2",
        dns,
        "wx",
        "y:9",
    ]
    # An empty name is no name: the URL stands in, as the gateway's members label it.
    assert [cfg.worker_label(u) for u in ("b:2", "b:9", "x:9")] == ["b:2", "b:9", "wx"]
    assert pairing.names == 4
    assert parse({"endpoints": ["a:1"]}).pairing() == Pairing((ConfiguredWorker("a:1"),), (), 0)


# -- docs/product.md §3.3: per-model entries inherit default_replicas --------------------------


def test_model_entry_without_replicas_inherits_default_replicas() -> None:
    cfg = parse(
        {
            "scheduling": {
                "default_replicas": "all",
                "models": {"resnet": {"fill_mode": "spread"}, "bert": {"replicas": 2}},
            }
        }
    )
    assert cfg.scheduling.models["resnet"] == ModelOverride(fill_mode=FillMode.SPREAD)
    assert cfg.scheduling.models["resnet"].replicas is None
    assert cfg.scheduling.replicas_for("resnet") == "all"
    assert cfg.scheduling.replicas_for("bert") == 2
    assert cfg.scheduling.replicas_for("unlisted") == "all"


def test_model_entry_defaults_are_inherit() -> None:
    cfg = parse({"scheduling": {"models": {"resnet": {}, "bert": None}}})
    for name in ("resnet", "bert"):
        assert cfg.scheduling.models[name] == ModelOverride(None, FillMode.INHERIT, 0.0)
    assert cfg.scheduling.replicas_for("resnet") == 1


# -- normalisation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "given", "expected"),
    [
        ("scheduling.mode", " LPT_Packing ", SchedulingMode.LPT_PACKING),
        ("scheduling.work_basis", "ITEMS", WorkBasis.ITEMS),
        ("scheduling.routing_policy", "Fill_RR", RoutingPolicy.FILL_RR),
        ("scheduling.routing_fill_mode", "Spread", FillMode.SPREAD),
        ("scheduling.compaction_mode", "SCHEDULED", CompactionMode.SCHEDULED),
        ("scheduling.default_replicas", "ALL", "all"),
        ("scheduling.default_replicas", " 3 ", 3),
        ("scheduling.rebalance_compute_seconds", 5, 5.0),
        ("logging.level", "DEBUG", "debug"),
        ("logging.format", "Text", "text"),
        ("listen.grpc", " 127.0.0.1:0 ", "127.0.0.1:0"),
    ],
)
def test_values_are_normalised(path: str, given: object, expected: object) -> None:
    value = get(parse(nested(path, given)), path)
    assert value == expected
    assert type(value) is type(expected)


def test_unquoted_off_is_compaction_mode_off() -> None:
    raw = yaml.safe_load("endpoints: [a:1]\nscheduling:\n  compaction_mode: off\n")
    assert raw["scheduling"]["compaction_mode"] is False  # YAML 1.1, as PyYAML reads it
    assert parse_config(raw).scheduling.compaction_mode is CompactionMode.OFF


def test_yaml_endpoint_lists_are_deduplicated_and_blanks_skipped() -> None:
    cfg = parse(
        {"endpoints": ["a:1", " b:2 ", "", "a:1", "  "], "metrics_endpoints": ["a:9", "a:9"]}
    )
    assert cfg.endpoints == ("a:1", "b:2")
    assert cfg.metrics_endpoints == ("a:9",)


def test_null_means_absent() -> None:
    cfg = parse({"listen": None, "scheduling": {"hysteresis": None, "models": None}})
    assert cfg == parse()


# -- validation (docs/original.md §3.3): every message names the key and the bad value ----------

INVALID: list[tuple[str, object, tuple[str, ...]]] = [
    # choices
    ("scheduling.mode", "fastest", ("scheduling.mode", "'fastest'", "'lpt_packing'")),
    ("scheduling.work_basis", "bytes", ("scheduling.work_basis", "'bytes'", "'requests'")),
    ("scheduling.routing_policy", "fill", ("scheduling.routing_policy", "'fill'", "'fill_rr'")),
    (
        "scheduling.routing_policy",
        "least_outstanding",
        ("scheduling.routing_policy", "'least_outstanding'", "Set scheduling.mode"),
    ),
    ("scheduling.routing_fill_mode", "inherit", ("scheduling.routing_fill_mode", "'inherit'")),
    ("scheduling.routing_fill_mode", "burst", ("routing_fill_mode", "'run', 'spread', or")),
    ("scheduling.compaction_mode", "lazy", ("scheduling.compaction_mode", "'lazy'", "'eager'")),
    ("scheduling.compaction_mode", True, ("scheduling.compaction_mode", "a string", "True")),
    ("logging.level", "verbose", ("logging.level", "'verbose'", "'warning'")),
    ("logging.format", "xml", ("logging.format", "'xml'", "'json'")),
    # replicas
    (
        "scheduling.default_replicas",
        0,
        ("scheduling.default_replicas", "positive integer or 'all'", "got 0"),
    ),
    ("scheduling.default_replicas", -2, ("default_replicas", "got -2")),
    ("scheduling.default_replicas", "some", ("default_replicas", "got 'some'")),
    ("scheduling.default_replicas", 1.5, ("default_replicas", "got 1.5")),
    ("scheduling.default_replicas", True, ("default_replicas", "got True")),
    # ranges
    (
        "worker_client.max_concurrent_streams",
        0,
        ("worker_client.max_concurrent_streams", "positive", "got 0"),
    ),
    (
        "worker_client.request_timeout_seconds",
        -5,
        ("worker_client.request_timeout_seconds", "got -5"),
    ),
    (
        "grpc.max_concurrent_requests_per_worker",
        -1,
        ("max_concurrent_requests_per_worker", "non-negative", "got -1"),
    ),
    ("grpc.max_recv_msg_bytes", 0, ("grpc.max_recv_msg_bytes", "got 0")),
    ("grpc.max_send_msg_bytes", 2**32, ("grpc.max_send_msg_bytes", "got 4294967296")),
    (
        "scheduling.rebalance_compute_seconds",
        0,
        ("scheduling.rebalance_compute_seconds", "must be positive", "got 0"),
    ),
    (
        "scheduling.first_rebalance_compute_seconds",
        -1,
        ("first_rebalance_compute_seconds", "non-negative", "got -1"),
    ),
    ("scheduling.max_worker_share", 0, ("scheduling.max_worker_share", "in (0, 1]", "got 0")),
    ("scheduling.max_worker_share", 1.5, ("max_worker_share", "got 1.5")),
    ("scheduling.hysteresis", 1, ("scheduling.hysteresis", "in [0, 1)", "got 1")),
    ("scheduling.hysteresis", -0.1, ("hysteresis", "got -0.1")),
    (
        "scheduling.ema_halflife_compute_seconds",
        -3,
        ("ema_halflife_compute_seconds", "non-negative", "got -3"),
    ),
    ("scheduling.routing_fill_factor", 0, ("scheduling.routing_fill_factor", "positive", "got 0")),
    (
        "scheduling.compaction_interval",
        -1,
        ("scheduling.compaction_interval", "non-negative", "got -1"),
    ),
    # YAML types
    (
        "scheduling.compaction_interval",
        1.5,
        ("config 'scheduling.compaction_interval' must be an integer", "1.5"),
    ),
    (
        "grpc.max_recv_msg_bytes",
        "512",
        ("config 'grpc.max_recv_msg_bytes' must be an integer", "'512'"),
    ),
    ("worker_client.max_concurrent_streams", True, ("must be an integer", "True")),
    ("scheduling.hysteresis", "0.5", ("config 'scheduling.hysteresis' must be a number", "'0.5'")),
    ("scheduling.hysteresis", False, ("config 'scheduling.hysteresis' must be a number", "False")),
    (
        "scheduling.rebalance_compute_seconds",
        math.inf,
        ("rebalance_compute_seconds' must be a finite number", "inf"),
    ),
    ("scheduling.rebalance_compute_seconds", math.nan, ("must be a finite number", "nan")),
    ("scheduling.rebalance_compute_seconds", 10**400, ("must be a finite number", "1000")),
    (
        "scheduling.forbid_memory_oversubscription",
        "yes",
        ("config 'scheduling.forbid_memory_oversubscription' must be a boolean", "'yes'"),
    ),
    ("scheduling.mode", 3, ("config 'scheduling.mode' must be a string", "got 3")),
    ("tls.cert_file", ["a"], ("config 'tls.cert_file' must be a string", "['a']")),
    ("listen.grpc", 8001, ("config 'listen.grpc' must be a string", "8001")),
    # addresses
    ("listen.grpc", "8001", ("listen.grpc must be host:port", "'8001'")),
    ("listen.metrics", "h:70000", ("listen.metrics", "'h:70000'")),
    ("listen.http", "h:70000", ("listen.http", "'h:70000'")),
    ("listen.metrics", "h:http", ("listen.metrics", "'h:http'")),
]


@pytest.mark.parametrize(("path", "value", "fragments"), INVALID)
def test_invalid_value_names_key_and_value(
    path: str, value: object, fragments: tuple[str, ...]
) -> None:
    raises(nested(path, value), *fragments)


@pytest.mark.parametrize(
    ("entry", "fragments"),
    [
        (
            {"replicas": 0},
            ("scheduling.models.resnet.replicas must be a positive integer or 'all', got 0",),
        ),
        ({"replicas": "x"}, ("scheduling.models.resnet.replicas", "'x'")),
        ({"fill_mode": "burst"}, ("scheduling.models.resnet.fill_mode", "or 'inherit'", "'burst'")),
        ({"fill_factor": 0}, ("scheduling.models.resnet.fill_factor must be positive, got 0",)),
        ({"fill_factor": -1.5}, ("scheduling.models.resnet.fill_factor", "got -1.5")),
        (
            {"fill_factor": "2"},
            ("config 'scheduling.models.resnet.fill_factor' must be a number", "'2'"),
        ),
        ([1, 2], ("config 'scheduling.models.resnet' must be a mapping", "[1, 2]")),
    ],
)
def test_invalid_model_entry(entry: object, fragments: tuple[str, ...]) -> None:
    raises({"scheduling": {"models": {"resnet": entry}}}, *fragments)


def test_models_must_be_a_mapping_of_names() -> None:
    raises(
        {"scheduling": {"models": ["resnet"]}},
        "config 'scheduling.models' must be a mapping",
        "['resnet']",
    )
    raises({"scheduling": {"models": {7: {}}}}, "scheduling.models' keys must be model names", "7")


@pytest.mark.parametrize(
    "block", ["listen", "worker_client", "grpc", "logging", "tls", "scheduling"]
)
def test_sub_block_must_be_a_mapping(block: str) -> None:
    raises({block: ["x"]}, f"config '{block}' must be a mapping", "['x']")
    raises({block: "x"}, f"config '{block}' must be a mapping", "'x'")


@pytest.mark.parametrize("root", [None, [], "endpoints: a:1", 3])
def test_root_must_be_a_mapping(root: object) -> None:
    with pytest.raises(ConfigError, match="gateway config root must be a mapping"):
        parse_config(root)


def test_no_endpoints() -> None:
    message = (
        "gateway has no endpoints; set 'endpoints:' in gateway.yml or REACTANT_GATEWAY_WORKERS"
    )
    raws: list[dict[str, Any]] = [
        {},
        {"endpoints": []},
        {"endpoints": ["", " "]},
        {"endpoints": None},
    ]
    for raw in raws:
        with pytest.raises(ConfigError) as info:
            parse_config(raw)
        assert str(info.value) == message


@pytest.mark.parametrize(
    ("key", "value", "fragments"),
    [
        (
            "endpoints",
            "a:1,b:2",
            ("gateway config 'endpoints' must be a list of host:port strings", "'a:1,b:2'"),
        ),
        (
            "endpoints",
            [1],
            ("gateway config 'endpoints' entries must be host:port strings", "got 1"),
        ),
        (
            "endpoints",
            ["a:1", "nocolon"],
            ("endpoints[1]: worker target 'nocolon' is not host:port",),
        ),
        ("endpoints", ["a:http"], ("endpoints[0]: worker target 'a:http' has a non-integer port",)),
        ("endpoints", ["a:0"], ("worker target 'a:0' has a port out of range",)),
        ("endpoints", [":80"], ("worker target ':80' has an empty host",)),
        (
            "endpoints",
            ["http://workers.ns.svc:8001"],
            ("worker target 'http://workers.ns.svc:8001' is a URL; give host:port",),
        ),
        (
            "endpoints",
            ["dns:///workers.ns.svc"],
            ("endpoints[0]: 'dns:///workers.ns.svc' is not dns:///NAME:PORT",),
        ),
        (
            "metrics_endpoints",
            {"a": 1},
            ("gateway config 'metrics_endpoints' must be a list", "{'a': 1}"),
        ),
        ("metrics_endpoints", ["x"], ("metrics_endpoints[0]: worker target 'x' is not host:port",)),
        ("worker_names", "w0", ("gateway config 'worker_names' must be a list of strings", "'w0'")),
        ("worker_names", [None], ("gateway config 'worker_names' entries must be strings", "None")),
    ],
)
def test_invalid_lists(key: str, value: object, fragments: tuple[str, ...]) -> None:
    raises({key: value}, *fragments)


def test_a_dns_endpoint_is_many_workers() -> None:
    dns = "dns:///workers.ns.svc:8001"
    assert parse({"endpoints": ["a:1", dns]}).endpoints == ("a:1", dns)
    config = parse({"endpoints": [dns], "metrics_endpoints": ["dns:///workers.ns.svc:9001"]})
    assert config.metrics_endpoints == ("dns:///workers.ns.svc:9001",)
    raises(
        {"endpoints": [dns], "worker_names": ["gpu"]}, "worker_names[0]:", "leave its name empty"
    )
    for metrics in ("a:9001", "dns:///other.ns.svc:9001"):
        raises(
            {"endpoints": [dns], "metrics_endpoints": [metrics]},
            f"metrics_endpoints[0]: '{metrics}' does not pair with endpoints[0]",
        )
    raises(
        {"endpoints": ["a:1"], "metrics_endpoints": ["dns:///a:9001"]},
        "metrics_endpoints[0]: 'dns:///a:9001' does not pair with endpoints[0] 'a:1'",
    )


def test_ipv6_endpoints_split_at_the_last_colon() -> None:
    assert parse({"endpoints": ["[::1]:8080"]}).endpoints == ("[::1]:8080",)


# -- warnings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "missing"), [("cert_file", "key_file"), ("key_file", "cert_file")])
def test_tls_needs_both_files(key: str, missing: str) -> None:
    with pytest.raises(ConfigError, match=rf"tls\.{missing} is required"):
        parse({"tls": {key: "/etc/tls/x.pem"}})
    with pytest.raises(ConfigError, match=r"tls\.client_ca_file needs tls\.cert_file"):
        parse({"tls": {"client_ca_file": "/etc/tls/ca.pem"}})
    tls = parse({"tls": {"cert_file": "c.pem", "key_file": "k.pem"}}).tls
    assert tls.enabled and not parse().tls.enabled


def test_inbound_cap_below_outbound_streams_warns() -> None:
    for cap, streams in ((31, 32), (8, 32)):
        cfg = parse(
            {
                "grpc": {"max_concurrent_requests_per_worker": cap},
                "worker_client": {"max_concurrent_streams": streams},
            }
        )
        (warning,) = risks(cfg)
        assert f"max_concurrent_requests_per_worker ({cap})" in warning
        assert f"max_concurrent_streams ({streams})" in warning
    assert risks(parse({"grpc": {"max_concurrent_requests_per_worker": 0}})) == []
    assert risks(parse()) == []  # the defaults: every call a worker may hold gets a stream


def test_unknown_keys_are_ignored_with_a_note() -> None:
    cfg = parse({"bogus": 1, "scheduling": {"rebalance": 5, "models": {"m": {"replica": 2}}}, 3: 4})
    assert cfg == parse({"scheduling": {"models": {"m": {}}}})
    assert set(risks(cfg)) == {
        "unknown gateway config key 'bogus' ignored",
        "unknown gateway config key 'scheduling.rebalance' ignored "
        "(did you mean scheduling.rebalance_compute_seconds?)",
        "unknown gateway config key 'scheduling.models.m.replica' ignored "
        "(did you mean scheduling.models.m.replicas?)",
        "unknown gateway config key '3' ignored",
    }


def test_unknown_environment_variables_are_named_with_the_nearest_known_one() -> None:
    cfg = parse(
        REACTANT_GATEWAY_SCHEDULNG_MODE="lpt_packing",
        REACTANT_GATEWAY_ZZZ="1",
        REACTANT_GATEWAYS_OTHER="1",  # not our prefix
        REACTANT_GATEWAY_STARTUP_WAIT_SECONDS="3",  # process-level, no YAML key
    )
    assert risks(cfg) == [
        "unknown environment variable REACTANT_GATEWAY_SCHEDULNG_MODE ignored (did you mean "
        "REACTANT_GATEWAY_SCHEDULING_MODE?)",
        "unknown environment variable REACTANT_GATEWAY_ZZZ ignored",
    ]
    assert cfg.scheduling == parse().scheduling


def test_strict_makes_unknown_keys_and_variables_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        parse(REACTANT_GATEWAY_SCHEDULNG_MODE="x", REACTANT_GATEWAY_STRICT="1")
    assert str(caught.value) == (
        "unknown environment variable REACTANT_GATEWAY_SCHEDULNG_MODE (did you mean "
        "REACTANT_GATEWAY_SCHEDULING_MODE?): REACTANT_GATEWAY_STRICT makes unknown settings "
        "errors"
    )
    with pytest.raises(ConfigError, match="unknown gateway config key 'bogus'"):
        parse({"bogus": 1}, REACTANT_GATEWAY_STRICT="yes")
    assert parse(REACTANT_GATEWAY_STRICT="1") == parse()


def test_name_count_mismatch_warns() -> None:
    (warning,) = risks(parse({"endpoints": ["a:1", "b:2"], "worker_names": ["w0"]}))
    assert "worker_names has 1 names for 2 endpoints" in warning


# -- the environment (docs/original.md §3.2) -----------------------------------------------------


def test_environment_variable_names() -> None:
    assert sorted(ENV_VARIABLES) == sorted(
        W + name
        for name in [
            "LISTEN_GRPC",
            "LISTEN_METRICS",
            "LISTEN_HTTP",
            "WORKERS",
            "WORKER_METRICS",
            "WORKER_NAMES",
            "WORKER_CLIENT_REQUEST_TIMEOUT_SECONDS",
            "WORKER_CLIENT_MAX_CONCURRENT_STREAMS",
            "WORKER_CLIENT_TLS_CA_FILE",
            "WORKER_CLIENT_TLS_CERT_FILE",
            "WORKER_CLIENT_TLS_KEY_FILE",
            "GRPC_MAX_RECV_MSG_BYTES",
            "GRPC_MAX_SEND_MSG_BYTES",
            "GRPC_MAX_CONCURRENT_REQUESTS_PER_WORKER",
            "GRPC_MAX_QUEUE_SECONDS",
            "LOGGING_LEVEL",
            "LOGGING_FORMAT",
            "LOGGING_ACCESS_LOG_SAMPLE_RATE",
            "LOGGING_ACCESS_LOG_MAX_PER_SECOND",
            "TLS_CERT_FILE",
            "TLS_KEY_FILE",
            "TLS_CLIENT_CA_FILE",
            "AUTH_TOKENS_FILE",
            "AUTH_TRUSTED_NETWORK",
            "SHM_MAX_REGIONS_PER_CLIENT",
            "SHM_MAX_BYTES_PER_CLIENT",
            "SHM_ALLOW_REMOTE_CLIENTS",
            "SHM_KEY_PREFIX",
            "SERVER_METADATA_NAME",
            "SERVER_METADATA_VERSION",
            "SHUTDOWN_GRACE_SECONDS",
            "OUTLIER_DETECTION_STALL_SECONDS",
            "OUTLIER_DETECTION_PING_TIMEOUT_SECONDS",
            "OUTLIER_DETECTION_EJECTION_SECONDS",
            "CONNECTIONS_MAX_CONNECTIONS",
            "CONNECTIONS_IDLE_SECONDS",
            "CONNECTIONS_HEADER_SECONDS",
            "CONNECTIONS_MAX_HEADER_LIST_BYTES",
            "CONNECTIONS_MAX_BUFFERED_BYTES",
            "CONNECTIONS_MAX_BUFFERED_BYTES_TOTAL",
            "CONNECTIONS_STREAM_WINDOW_BYTES",
            "COORDINATION_ETCD_ENDPOINTS",
            "COORDINATION_CLUSTER",
            "COORDINATION_LEASE_TTL_SECONDS",
            "COORDINATION_MEMBER",
            "CONNECTIONS_FLOOD_BUDGET",
            "CONNECTIONS_MAX_CONCURRENT_STREAMS",
            "METRICS_SCRAPE_TIMEOUT_SECONDS",
            "DISCOVERY_MODELS",
            "DISCOVERY_FOUND_TTL_SECONDS",
            "DISCOVERY_MISS_TTL_SECONDS",
            "DISCOVERY_LOOKUPS_PER_SECOND",
            "REPOSITORY_MODELS",
            "REPOSITORY_WORKER_BUDGET_BYTES",
            "REPOSITORY_DEFAULT_WEIGHT_BYTES",
            "REPOSITORY_DRAIN_SECONDS",
            "REPOSITORY_LOAD_TIMEOUT_SECONDS",
            "REPOSITORY_MIN_RESIDENCY_SECONDS",
            "REPOSITORY_LOAD_SECONDS",
            "REPOSITORY_EVICTION",
            "REPOSITORY_DEMAND_HALFLIFE_SECONDS",
            "SCHEDULING_MODE",
            "SCHEDULING_WORK_BASIS",
            "SCHEDULING_REBALANCE_COMPUTE_SECONDS",
            "SCHEDULING_FIRST_REBALANCE_COMPUTE_SECONDS",
            "SCHEDULING_MAX_WORKER_SHARE",
            "SCHEDULING_HYSTERESIS",
            "SCHEDULING_EMA_HALFLIFE_COMPUTE_SECONDS",
            "SCHEDULING_DEFAULT_REPLICAS",
            "SCHEDULING_ROUTING_FILL_FACTOR",
            "SCHEDULING_ROUTING_POLICY",
            "SCHEDULING_ROUTING_FILL_MODE",
            "SCHEDULING_FORBID_MEMORY_OVERSUBSCRIPTION",
            "SCHEDULING_COMPACTION_MODE",
            "SCHEDULING_COMPACTION_INTERVAL",
            "TENANCY_HEADER",
            "TENANCY_PRIORITY_LEVELS",
            "TENANCY_DEFAULT_PRIORITY",
            "TENANCY_MAX_TENANT_SERIES",
        ]
    )
    assert env_name("scheduling.default_replicas") == W + "SCHEDULING_DEFAULT_REPLICAS"


ENV_BEATS_YAML: list[tuple[str, object, str, object]] = [
    ("listen.grpc", "0.0.0.0:1", "127.0.0.1:9001", "127.0.0.1:9001"),
    ("worker_client.request_timeout_seconds", 5, "7", 7),
    ("grpc.max_concurrent_requests_per_worker", 5, "0", 0),
    ("logging.format", "json", "text", "text"),
    ("worker_client.tls_ca_file", "ca.pem", "other.pem", "other.pem"),
    ("scheduling.mode", "round_robin", "lpt_packing", SchedulingMode.LPT_PACKING),
    ("scheduling.hysteresis", 0.5, "0.25", 0.25),
    ("scheduling.default_replicas", 2, "all", "all"),
    ("scheduling.default_replicas", "all", "3", 3),
    ("scheduling.forbid_memory_oversubscription", True, "off", False),
    ("scheduling.compaction_interval", 4, "0", 0),
]


@pytest.mark.parametrize(("path", "yaml_value", "env_value", "expected"), ENV_BEATS_YAML)
def test_environment_beats_yaml(
    path: str, yaml_value: object, env_value: str, expected: object
) -> None:
    var = env_name(path)
    cfg = parse(nested(path, yaml_value), **{var: env_value})
    assert get(cfg, path) == expected
    assert cfg.env_overrides == (var,)


def test_environment_replaces_a_bad_yaml_value_and_a_missing_block() -> None:
    cfg = parse({"scheduling": {"hysteresis": "junk"}}, **{W + "SCHEDULING_HYSTERESIS": "0.1"})
    assert cfg.scheduling.hysteresis == 0.1
    cfg = parse_config({}, {W + "WORKERS": "a:1", W + "SCHEDULING_MODE": "least_outstanding"})
    assert cfg.scheduling.mode is SchedulingMode.LEAST_OUTSTANDING


def test_environment_into_a_non_mapping_block_fails() -> None:
    raises(
        {"scheduling": 5},
        "config 'scheduling' must be a mapping",
        **{W + "SCHEDULING_MODE": "lpt_packing"},
    )


def test_environment_values_are_validated_like_yaml() -> None:
    raises(
        {}, "scheduling.hysteresis must be in [0, 1), got 1.0", **{W + "SCHEDULING_HYSTERESIS": "1"}
    )
    raises({}, "scheduling.default_replicas", "got '0'", **{W + "SCHEDULING_DEFAULT_REPLICAS": "0"})


def test_blank_variables_are_unset() -> None:
    cfg = parse({"worker_names": ["w"]}, **{W + "WORKER_NAMES": "", W + "LOGGING_LEVEL": "  "})
    assert cfg.worker_names == ("w",)
    assert cfg.env_overrides == ()


def test_other_variables_are_ignored() -> None:
    assert parse(**{"PATH": "/bin", W + "UNKNOWN": "1"}) == parse()


def test_workers_variable_splits_strips_and_keeps_duplicates() -> None:
    cfg = parse({"endpoints": ["yaml:1"]}, **{W + "WORKERS": " a:1, ,b:2,,a:1 "})
    assert cfg.endpoints == ("a:1", "b:2", "a:1")
    assert cfg.env_overrides == (W + "WORKERS",)
    cfg = parse(**{W + "WORKER_METRICS": "a:9,b:9", W + "WORKER_NAMES": " w0,,w1, "})
    assert cfg.metrics_endpoints == ("a:9", "b:9")
    assert cfg.worker_names == ("w0", "w1")


@pytest.mark.parametrize("var", ["WORKERS", "WORKER_METRICS"])
@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("a:1,nocolon", "worker target 'nocolon' is not host:port"),
        ("a:x", "worker target 'a:x' has a non-integer port"),
        ("a:1,b:99999", "worker target 'b:99999' has a port out of range"),
    ],
)
def test_list_variables_validate_host_port(var: str, value: str, fragment: str) -> None:
    raises({}, W + var, fragment, **{W + var: value})


def test_workers_variable_of_only_commas_leaves_no_endpoints() -> None:
    raises({}, "gateway has no endpoints", **{W + "WORKERS": " , ,"})


@pytest.mark.parametrize("word", ["1", "true", "TRUE", "yes", "Yes", "on", " On "])
def test_boolean_variables_true_words(word: str) -> None:
    cfg = parse(
        {"scheduling": {"forbid_memory_oversubscription": False}},
        **{W + "SCHEDULING_FORBID_MEMORY_OVERSUBSCRIPTION": word},
    )
    assert cfg.scheduling.forbid_memory_oversubscription is True


@pytest.mark.parametrize("word", ["0", "false", "no", "off", "2", "enabled", "y"])
def test_boolean_variables_anything_else_is_false(word: str) -> None:
    cfg = parse(**{W + "SCHEDULING_FORBID_MEMORY_OVERSUBSCRIPTION": word})
    assert cfg.scheduling.forbid_memory_oversubscription is False


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("GRPC_MAX_RECV_MSG_BYTES", "512MiB", 'invalid integer value "512MiB"'),
        ("WORKER_CLIENT_MAX_CONCURRENT_STREAMS", "3.5", 'invalid integer value "3.5"'),
        ("SCHEDULING_COMPACTION_INTERVAL", "x", 'invalid integer value "x"'),
        ("SCHEDULING_HYSTERESIS", "half", 'invalid number value "half"'),
        ("SCHEDULING_REBALANCE_COMPUTE_SECONDS", "nan", 'invalid number value "nan"'),
        ("SCHEDULING_ROUTING_FILL_FACTOR", "inf", 'invalid number value "inf"'),
    ],
)
def test_numeric_variables_that_do_not_parse(var: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(**{W + var: value})
    assert str(info.value) == f"environment override {W}{var} has {message}"


def test_numeric_variables_parse() -> None:
    cfg = parse(
        **{
            W + "GRPC_MAX_SEND_MSG_BYTES": " 1048576 ",
            W + "SCHEDULING_REBALANCE_COMPUTE_SECONDS": "1e2",
            W + "SCHEDULING_MAX_WORKER_SHARE": "1",
        }
    )
    assert cfg.grpc.max_send_msg_bytes == 1048576
    assert cfg.scheduling.rebalance_compute_seconds == 100.0
    assert cfg.scheduling.max_worker_share == 1.0


# -- the process-level variables ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("inf", math.inf),
        ("INF", math.inf),
        ("Infinity", math.inf),
        ("forever", math.inf),
        ("FOREVER", math.inf),
        ("-1", math.inf),
        ("-1.0", math.inf),
        ("0", 0.0),
        ("12.5", 12.5),
        ("", 0.0),
    ],
)
def test_startup_wait_seconds(value: str, seconds: float) -> None:
    assert parse(**{W + "STARTUP_WAIT_SECONDS": value}).startup_wait_seconds == seconds


@pytest.mark.parametrize("value", ["soon", "-5", "nan", "1s"])
def test_startup_wait_seconds_rejects_what_it_cannot_read(value: str) -> None:
    raises({}, W + "STARTUP_WAIT_SECONDS", repr(value), **{W + "STARTUP_WAIT_SECONDS": value})


@pytest.mark.parametrize(
    ("value", "seconds", "noted"),
    [
        ("2.5", 2.5, False),
        ("abc", 10.0, True),
        ("0", 10.0, True),
        ("-3", 10.0, True),
        ("inf", 10.0, True),
    ],
)
def test_health_interval_falls_back_to_ten(value: str, seconds: float, noted: bool) -> None:
    cfg = parse(**{W + "HEALTH_INTERVAL_SECONDS": value})
    assert cfg.health_interval_seconds == seconds
    assert any(W + "HEALTH_INTERVAL_SECONDS" in w for w in cfg.warnings) is noted


@pytest.mark.parametrize(("value", "rounds"), [("0", 0), ("5", 5), (" 3 ", 3)])
def test_wedge_exit_rounds(value: str, rounds: int) -> None:
    assert parse(**{W + "WEDGE_EXIT_ROUNDS": value}).wedge_exit_rounds == rounds


@pytest.mark.parametrize(
    ("value", "fragment"), [("x", 'invalid integer value "x"'), ("2.5", '"2.5"'), ("-1", "'-1'")]
)
def test_wedge_exit_rounds_must_be_an_integer(value: str, fragment: str) -> None:
    raises({}, W + "WEDGE_EXIT_ROUNDS", fragment, **{W + "WEDGE_EXIT_ROUNDS": value})


# -- immutability ------------------------------------------------------------------------------


def test_config_is_immutable_and_hashable() -> None:
    cfg = parse({"scheduling": {"models": {"m": {"replicas": 2}}}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.endpoints = ()  # type: ignore[misc]  # the point of the test
    with pytest.raises(TypeError):
        cfg.scheduling.models["x"] = ModelOverride()  # type: ignore[index]  # read-only mapping
    assert isinstance(cfg.endpoints, tuple)
    assert hash(cfg) == hash(parse({"scheduling": {"models": {"m": {"replicas": 2}}}}))


def test_replace_is_validated_like_yaml() -> None:
    scheduling = parse().scheduling
    with pytest.raises(ConfigError, match=r"scheduling.hysteresis must be in \[0, 1\), got 1.0"):
        dataclasses.replace(scheduling, hysteresis=1.0)
    replaced = dataclasses.replace(scheduling, mode="LPT_packing")  # type: ignore[arg-type]  # normalised
    assert replaced.mode is SchedulingMode.LPT_PACKING
    with pytest.raises(ConfigError, match=r"scheduling\.models\.m\.replicas"):
        SchedulingConfig(models={"m": ModelOverride(replicas=0)})
    with pytest.raises(ConfigError, match="gateway has no endpoints"):
        GatewayConfig(endpoints=())


# -- files (docs/original.md §3.1) ------------------------------------------------------


def write(path: pathlib.Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_load_config_reads_the_named_file(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "gateway.yml", "endpoints: [a:1]\nscheduling:\n  mode: lpt_packing\n")
    for name in (path, pathlib.Path(path)):
        cfg = load_config(name, env={})
        assert cfg.endpoints == ("a:1",)
        assert cfg.scheduling.mode is SchedulingMode.LPT_PACKING
        assert cfg.source == path


def test_load_config_named_file_must_exist(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope.yml"
    with pytest.raises(ConfigError) as info:
        load_config(missing, env={W + "WORKERS": "a:1"})
    assert str(info.value) == f"gateway config file not found: {missing}"


def test_load_config_follows_reactant_gateway_file(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "g.yml", "endpoints: [a:1]\n")
    assert load_config(env={W + "FILE": path}).source == path
    with pytest.raises(ConfigError) as info:
        load_config(env={W + "FILE": str(tmp_path / "gone.yml")})
    assert (
        str(info.value)
        == f"REACTANT_GATEWAY_FILE points at a missing file: {tmp_path / 'gone.yml'}"
    )


def test_load_config_conventional_path(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "gateway.yml", "endpoints: [etc:1]\n")
    monkeypatch.setattr(_config, "DEFAULT_CONFIG_PATH", path)
    assert load_config(env={}).endpoints == ("etc:1",)
    assert find_config_file({}) == path
    other = write(tmp_path / "other.yml", "endpoints: [other:1]\n")
    assert load_config(env={W + "FILE": other}).endpoints == ("other:1",)


def test_load_config_without_a_file_uses_the_environment(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_config, "DEFAULT_CONFIG_PATH", str(tmp_path / "absent.yml"))
    assert find_config_file({}) is None
    cfg = load_config(env={W + "WORKERS": "a:1,b:2"})
    assert cfg.endpoints == ("a:1", "b:2")
    assert cfg.source is None
    with pytest.raises(ConfigError, match="gateway has no endpoints"):
        load_config(env={})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "gateway config root must be a mapping, got None"),
        ("- a:1\n", "gateway config root must be a mapping"),
        ("endpoints: [a:1\n", "invalid YAML at line"),
        ("endpoints: [a:1]\nendpoints: [b:2]\n", "duplicate key 'endpoints'"),
        ("scheduling:\n  mode: x\n  mode: y\n", "duplicate key 'mode'"),
    ],
)
def test_load_config_bad_files(tmp_path: pathlib.Path, text: str, fragment: str) -> None:
    path = write(tmp_path / "g.yml", text)
    with pytest.raises(ConfigError, match=fragment):
        load_config(path, env={})


def test_load_config_unreadable(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="cannot read gateway config"):
        load_config(tmp_path, env={})
    (tmp_path / "bin.yml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(tmp_path / "bin.yml", env={})


def test_public_load_config_is_this_one() -> None:
    assert rsgw.load_config is load_config
    assert rsgw.GatewayConfig is GatewayConfig


def test_docs_name_every_key_and_variable() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for var in (
        *ENV_VARIABLES,
        *OTEL_VARIABLES,
        *OTEL_GENERAL,
        *OTEL_SWITCHES,
        W + "FILE",
        W + "STARTUP_WAIT_SECONDS",
        W + "HEALTH_INTERVAL_SECONDS",
        W + "WEDGE_EXIT_ROUNDS",
    ):
        assert f"`{var}`" in text, var
    for path, _ in DEFAULTS:
        leaf = path.rsplit(".", 1)[-1]
        assert f"`{leaf}" in text or f"`{path}" in text, path


# -- properties ----------------------------------------------------------------------------------

hosts = st.sampled_from(["10.0.0.1", "worker-a", "[::1]", "gpu3.local"])
targets = st.builds(lambda h, p: f"{h}:{p}", hosts, st.integers(1, 65535))
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12)
ints = st.integers(-(2**40), 2**40)


def words(*choices: str) -> st.SearchStrategy[str]:
    return st.sampled_from(choices).flatmap(lambda w: st.sampled_from([w, w.upper(), f" {w} "]))


replicas = st.one_of(st.integers(1, 64), words("all"), st.integers(1, 64).map(str))
model_entries = st.fixed_dictionaries(
    {},
    optional={
        "replicas": replicas,
        "fill_mode": words("run", "spread", "inflight", "inherit"),
        "fill_factor": st.floats(min_value=1e-3, max_value=1e3),
    },
)
valid_scheduling = st.fixed_dictionaries(
    {},
    optional={
        "mode": words("round_robin", "least_outstanding", "lpt_packing"),
        "work_basis": words("compute", "items", "requests"),
        "rebalance_compute_seconds": st.floats(min_value=1e-3, max_value=1e6),
        "first_rebalance_compute_seconds": st.floats(min_value=0, max_value=1e6),
        "max_worker_share": st.floats(min_value=1e-3, max_value=1.0),
        "hysteresis": st.floats(min_value=0, max_value=0.999),
        "ema_halflife_compute_seconds": st.one_of(
            st.just(0), st.floats(min_value=0, max_value=1e6)
        ),
        "default_replicas": replicas,
        "routing_fill_factor": st.floats(min_value=1e-3, max_value=1e3),
        "routing_policy": words("fill_rr", "fill_least"),
        "routing_fill_mode": words("run", "spread", "inflight"),
        "forbid_memory_oversubscription": st.booleans(),
        "compaction_mode": st.one_of(words("off", "eager", "scheduled"), st.just(False)),
        "compaction_interval": st.integers(0, 100),
        "models": st.dictionaries(
            st.text(min_size=1, max_size=8).filter(str.strip), model_entries, max_size=3
        ),
    },
)
quota_entries = {
    "rate": st.floats(min_value=0, max_value=1e4),
    "max_concurrent": st.integers(0, 1000),
}
valid_tenancy = st.integers(1, 16).flatmap(
    lambda levels: st.fixed_dictionaries(
        {"priority_levels": st.just(levels)},
        optional={
            "header": st.sampled_from(["", "x-tenant-id", "X-Team"]),
            "default_priority": st.integers(0, levels),
            "max_tenant_series": st.integers(1, 10_000),
            "tenants": st.dictionaries(
                st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1),
                st.fixed_dictionaries(
                    {},
                    optional={
                        "weight": st.floats(min_value=1e-3, max_value=1e3),
                        "priority": st.integers(0, levels),
                        **quota_entries,
                    },
                ),
                max_size=3,
            ),
            "default": st.fixed_dictionaries({}, optional=quota_entries),
        },
    )
)
valid_configs = st.fixed_dictionaries(
    {"endpoints": st.lists(targets, min_size=1, max_size=4)},
    optional={
        "metrics_endpoints": st.lists(targets, max_size=4),
        "worker_names": st.lists(st.text(min_size=1, max_size=8), max_size=4),
        "listen": st.fixed_dictionaries({}, optional={"grpc": targets, "metrics": targets}),
        "worker_client": st.fixed_dictionaries(
            {},
            optional={
                "request_timeout_seconds": st.integers(1, 3600),
                "max_concurrent_streams": st.integers(1, 1024),
            },
        ),
        "grpc": st.fixed_dictionaries(
            {},
            optional={
                "max_recv_msg_bytes": st.integers(1, 2**32 - 1),
                "max_send_msg_bytes": st.integers(1, 2**32 - 1),
                "max_concurrent_requests_per_worker": st.integers(0, 4096),
            },
        ),
        "logging": st.fixed_dictionaries(
            {},
            optional={
                "level": words("debug", "info", "warning", "error"),
                "format": words("auto", "json", "text"),
            },
        ),
        "tls": st.one_of(
            st.just({}),
            st.fixed_dictionaries(
                {"cert_file": st.text(min_size=1, max_size=10), "key_file": st.text(max_size=10)},
                optional={"client_ca_file": st.text(max_size=10)},
            ).filter(lambda tls: bool(tls["key_file"])),
        ),
        "scheduling": valid_scheduling,
        "tenancy": valid_tenancy,
    },
)


@given(valid_configs)
def test_valid_configs_round_trip(raw: dict[str, Any]) -> None:
    cfg = parse_config(raw)
    dumped = cfg.to_mapping()
    assert parse_config(dumped) == cfg
    assert parse_config(yaml.safe_load(yaml.safe_dump(dumped))) == cfg
    assert cfg.to_mapping() == parse_config(dumped).to_mapping()


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["all", "a:1", "lpt_packing", "run", "inherit", "0", "-1", "inf", ""]),
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=4),
    ),
    max_leaves=12,
)
KEY_PATHS = [p for p, _ in DEFAULTS if not p.startswith(("startup", "health", "wedge", "probe"))]


@given(
    valid_configs,
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    *KEY_PATHS,
                    "endpoints",
                    "scheduling.models.m",
                    "scheduling.models.m.replicas",
                    "scheduling.models.m.fill_factor",
                ]
            ),
            junk,
        ),
        max_size=4,
    ),
    st.dictionaries(
        st.sampled_from(
            [
                *ENV_VARIABLES,
                W + "STARTUP_WAIT_SECONDS",
                W + "HEALTH_INTERVAL_SECONDS",
                W + "WEDGE_EXIT_ROUNDS",
            ]
        ),
        st.one_of(st.text(max_size=12), st.sampled_from(["a:1", "1", "inf", "all", "0.5"])),
        max_size=3,
    ),
)
def test_junk_raises_config_error_and_nothing_else(
    raw: dict[str, Any], damage: list[tuple[str, object]], env: dict[str, str]
) -> None:
    for path, value in damage:
        *parents, leaf = path.split(".")
        target: Any = raw
        for parent in parents:
            if not isinstance(target.get(parent), dict):
                target[parent] = {}
            target = target[parent]
        target[leaf] = value
    try:
        cfg = parse_config(raw, env)
    except ConfigError:
        return
    assert parse_config(cfg.to_mapping()) == dataclasses.replace(
        cfg,
        startup_wait_seconds=0.0,
        health_interval_seconds=10.0,
        wedge_exit_rounds=3,
    )


@given(junk)
def test_any_root_raises_config_error_or_parses(raw: object) -> None:
    with contextlib.suppress(ConfigError):
        parse_config(raw)


def test_no_endpoints_names_the_misspelt_key_that_would_have_given_them() -> None:
    """Issue 40: `endpoint:` for `endpoints:` was a bare "no endpoints" error, its
    unknown-key warning never printed (the start stopped first)."""
    with pytest.raises(ConfigError) as refused:
        parse_config({"endpoint": ["127.0.0.1:1"]})
    assert str(refused.value) == (
        "gateway has no endpoints; set 'endpoints:' in gateway.yml or REACTANT_GATEWAY_WORKERS; "
        "unknown gateway config key 'endpoint' ignored (did you mean endpoints?)"
    )
