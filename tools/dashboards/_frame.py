"""What every rsgw dashboard shares: the selector, the panel kinds, the variables, the frame.

The dashboards are written with grafana-foundation-sdk's typed builders, so their JSON
follows Grafana's own schema (no Grafana server runs on these machines to check ours).
This module pins the choices the five dashboards make alike: every query selects `job`
and `instance` through template variables and reads the Prometheus datasource chosen in
the `datasource` variable; each panel kind has one size (a row of stats is four wide,
graphs two, tables one) and states the options Grafana would otherwise default, since the
schema wants an `options` object and the SDK leaves it null when none is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import bargauge as bargauge_builder
from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dashboard_builder
from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.builders import stat as stat_builder
from grafana_foundation_sdk.builders import table as table_builder
from grafana_foundation_sdk.builders import timeseries as timeseries_builder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

if TYPE_CHECKING:
    from grafana_foundation_sdk.cog import builder as cogbuilder
    from grafana_foundation_sdk.cog import variants as cogvariants

#: The selector every query starts from.
S = 'job=~"$job",instance=~"$instance"'
RATE = "[$__rate_interval]"
INFER = f'{S},rpc="ModelInfer"'
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: Grafana's grid is 24 columns wide.
GRID_WIDTH = 24


class _Panel(Protocol):
    """What the four panel builders we use have in common (each is its own class)."""

    def title(self, title: str, /) -> Self: ...
    def description(self, description: str, /) -> Self: ...
    def datasource(self, datasource: model.DataSourceRef, /) -> Self: ...
    def unit(self, unit: str, /) -> Self: ...
    def span(self, w: int, /) -> Self: ...
    def height(self, h: int, /) -> Self: ...
    def with_target(self, target: cogbuilder.Builder[cogvariants.Dataquery], /) -> Self: ...


P = TypeVar("P", bound=_Panel)


def q(expr: str, legend: str = "") -> prometheus.Dataquery:
    """A range query over the chosen datasource; no legend lets Grafana name the series."""
    return prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").range()


def _framed(
    panel: P,
    title: str,
    description: str,
    queries: list[prometheus.Dataquery],
    *,
    unit: str,
    width: int,
    height: int,
) -> P:
    """`panel` with its words, size and queries (refIds A, B, ...), all on our datasource."""
    panel.title(title).description(description).datasource(DATASOURCE).unit(unit)
    panel.span(width).height(height)
    for ref, query in zip("ABCDEFGH", queries, strict=False):
        panel.with_target(query.ref_id(ref).datasource(DATASOURCE))
    return panel


def _all_values() -> common_builder.ReduceDataOptions:
    """One value per series, its last one that is not null (what Grafana itself defaults to)."""
    return common_builder.ReduceDataOptions().values(False).calcs(["lastNotNull"]).fields("")


def graph(
    title: str, description: str, *queries: prometheus.Dataquery, unit: str = "short"
) -> timeseries_builder.Panel:
    """A time series graph, half a row wide, its legend listed below it."""
    panel = timeseries_builder.Panel()
    legend = common_builder.VizLegendOptions().show_legend(True).calcs([])
    legend.display_mode(common.LegendDisplayMode.LIST).placement(common.LegendPlacement.BOTTOM)
    tooltip = common_builder.VizTooltipOptions().mode(common.TooltipDisplayMode.SINGLE)
    panel.legend(legend).tooltip(tooltip.sort(common.SortOrder.NONE))
    return _framed(panel, title, description, list(queries), unit=unit, width=12, height=8)


def bars(title: str, description: str, *queries: prometheus.Dataquery) -> bargauge_builder.Panel:
    """A bar gauge of each series' latest value, half a row wide."""
    panel = bargauge_builder.Panel().reduce_options(_all_values())
    return _framed(panel, title, description, list(queries), unit="short", width=12, height=8)


def stat(title: str, description: str, expr: str, unit: str = "short") -> stat_builder.Panel:
    """One figure, a quarter of a row wide."""
    panel = stat_builder.Panel().reduce_options(_all_values())
    return _framed(panel, title, description, [q(expr)], unit=unit, width=6, height=4)


def table(title: str, description: str, expr: str) -> table_builder.Panel:
    """The latest value of each series as a table row, labels as columns, a whole row wide."""
    panel = table_builder.Panel().show_header(True)
    hide = {"excludeByName": {"Time": True, "__name__": True}}
    panel.with_transformation(model.DataTransformerConfig(id_val="organize", options=hide))
    query = q(expr).instant().format(PromQueryFormat.TABLE)
    return _framed(panel, title, description, [query], unit="short", width=24, height=9)


def _query_variable(name: str, label: str, query: str) -> dashboard_builder.QueryVariable:
    """A multi-choice variable whose values come from a `label_values(...)` query."""
    variable = dashboard_builder.QueryVariable(name).id(name).label(label).datasource(DATASOURCE)
    variable.query({"query": query, "refId": f"{name}-values"})
    variable.refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
    variable.sort(model.VariableSort.ALPHABETICAL_ASC)
    return variable.include_all(True).multi(True).all_value(".*")


def _variables() -> list[cogbuilder.Builder[model.VariableModel]]:
    # Each variable's id is its name: Grafana's schema defaults every id to the same nil UUID,
    # and Grafana's (pre-Scenes) variable store keys variables by id, falling back to the name.
    return [
        dashboard_builder.DatasourceVariable("datasource")
        .id("datasource")
        .label("Prometheus")
        .type("prometheus"),
        _query_variable("job", "Job", "label_values(gateway_build_info, job)"),
        _query_variable(
            "instance", "Gateway", 'label_values(gateway_build_info{job=~"$job"}, instance)'
        ),
        _query_variable(
            "model", "Model", f"label_values(gateway_model_ready_replicas{{{S}}}, model)"
        ),
        _query_variable("worker", "Worker", f"label_values(gateway_worker_ready{{{S}}}, worker)"),
    ]


def board(
    uid: str, title: str, description: str, panels: list[cogbuilder.Builder[model.Panel]]
) -> model.Dashboard:
    """A dashboard: its panels left to right, top to bottom, numbered from 1.

    The SDK lays the panels out, and wraps to a new row only after one is full; so each
    row's widths must add up to the grid's width (a panel that does not fit raises).

    Raises:
        ValueError: a panel sticks out past the right edge of the grid.
    """
    builder = dashboard_builder.Dashboard(title).uid(uid).description(description)
    builder.tags(["rsgw"]).version(1).editable().timezone("utc").refresh("30s")
    builder.time("now-1h", "now").tooltip(model.DashboardCursorSync.CROSSHAIR)
    builder.variables(_variables())
    link = dashboard_builder.DashboardLink("rsgw").type(model.DashboardLinkType.DASHBOARDS)
    builder.link(link.tags(["rsgw"]).as_dropdown(True))
    for panel in panels:
        builder.with_panel(panel)
    built = builder.build()
    for number, item in enumerate(built.panels or [], start=1):
        item.id_val = number
        grid = item.grid_pos
        if grid is not None and grid.x + grid.w > GRID_WIDTH:
            raise ValueError(f"{uid}: panel {item.title!r} does not fit in its row")
    return built
