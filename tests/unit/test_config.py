from datetime import timedelta

import pytest

from shared.config import ConfigError, ReservoirConfig, load_config
from shared.resources import Resources


def test_empty_config_is_all_defaults() -> None:
    config = load_config("")
    assert config == ReservoirConfig()
    assert config.dry_run is False
    assert config.max_locked_node_percent == 50
    assert config.starvation.reserved_node_percent == 20
    assert config.windows == []


def test_seed_004_example_is_accepted_and_translated() -> None:
    config = load_config("""
windows:
- name: ebook
  nodeSelector: {business_type: ebook}
  resources: {cpu: "32", memory: 64Gi}
  startReserveAgo: 2h
  podNumToReserve: 10
  cron: "0 3 - 4 * * *"
""")
    window = config.windows[0]
    assert window.schedule == "0 3 * * *"
    assert window.duration == timedelta(hours=1)
    assert window.start_reserve_ago == timedelta(hours=2)
    assert window.resources == Resources({"cpu": 32000, "memory": 64 * 2**30})
    assert window.pod_num_to_reserve == 10


def test_seed_000_threshold_in_seconds() -> None:
    config = load_config("starvation: {starvingJobTimeThreshold: 172800, reservedNodePercent: 50}")
    assert config.starvation.starving_job_time_threshold == timedelta(days=2)
    assert config.starvation.reserved_node_percent == 50


def test_round_trip_through_aliases() -> None:
    config = load_config("windows: [{name: w, resources: {cpu: 2}, schedule: '*/5 * * * *', duration: 90m}]")
    dumped = config.model_dump(by_alias=True)
    assert dumped["windows"][0]["duration"] == "1h30m"
    assert ReservoirConfig.model_validate(dumped) == config


@pytest.mark.parametrize(("text", "expected"), [
    ("maxLockedNodePercent: 120", "maxLockedNodePercent: Input should be less than or equal to 90 (got 120)"),
    ("dryrun: true", "dryrun: unknown field"),
    ("starvation: {maxLockDuration: 2 hours}", "starvation.maxLockDuration: duration '2 hours' is not valid"),
    ("windows: [{name: w, resources: {cpu: lots}, schedule: '0 3 * * *', duration: 1h}]",
     "windows[0].resources: quantity 'lots' is not valid"),
    ("windows: [{name: w, resources: {}, schedule: '0 3 * *', duration: 1h}]",
     "schedule '0 3 * *' is not a 5-field cron expression"),
    ("windows: [{name: w, resources: {}, schedule: '0 3 * * *'}]", "a window needs schedule"),
    ("windows: [{name: w, resources: {}, cron: '0 3 - 4 * * *', duration: 1h}]", "not both"),
    ("windows: [{name: w, resources: {}, schedule: '0 3 * * *', duration: 1h, timezone: Mars/Base}]",
     "unknown timezone 'Mars/Base'"),
    ("windows: [{name: w, resources: {}, schedule: '0 3 * * *', duration: 1h},"
     " {name: w, resources: {}, schedule: '0 4 * * *', duration: 1h}]", "window name 'w' is used twice"),
    ("windows: [{name: Bad_Name, resources: {}, schedule: '0 3 * * *', duration: 1h}]", "windows[0].name"),
    ("queueOrder: {ordering: random}", "queueOrder.ordering"),
    ("- just a list", "must be a mapping"),
    ("a: [unclosed", "not valid YAML"),
])
def test_errors_name_the_field_and_value(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(text)
    assert expected in str(err.value)


def test_config_from_configmap_events() -> None:
    from shared import keys
    from shared.kinds import config_from

    good = load_config("dryRun: true")
    configmap = {"metadata": {"name": keys.CONFIGMAP_NAME}, "data": {keys.CONFIG_KEY: "maxLockedNodePercent: 30"}}
    config, error = config_from("MODIFIED", configmap, good)
    assert error is None and config.max_locked_node_percent == 30 and not config.dry_run
    bad = {"metadata": {"name": keys.CONFIGMAP_NAME}, "data": {keys.CONFIG_KEY: "maxLockedNodePercent: 300"}}
    config, error = config_from("MODIFIED", bad, good)
    assert config is good and error is not None and "maxLockedNodePercent" in str(error)
    assert config_from("DELETED", configmap, good) == (ReservoirConfig(), None)
